// sharded_test_fixture.h: the folder and file helpers of the sharded
// checkpoint tests (test_sharded_checkpoint.cpp, test_sharded_folder.cpp).
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "stages/stage_test_util.h"
#include "test_util.h"

namespace zf {

class ShardedCheckpoint : public test::TempDirTest {
 protected:
  std::string bytes_of(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // Two ranks of the tiny model for two steps, saving a sharded folder into `dir`.
  static TrainConfig saving_sharded(const std::string& dir) {
    TrainConfig cfg = test::quiet_config("tiny", 2, 2, 2);
    cfg.save = dir;
    cfg.save_sharded = true;
    return cfg;
  }
  std::vector<std::string> entries(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

}  // namespace zf
