// test_sharded_folder.cpp: a sharded --save folder belongs to the run that
// writes it (common/io/sharded_checkpoint.h): every file carries its
// save's id, a save follows no link, one run at a time holds the folder,
// and a `latest` that names no checkpoint is never replaced.
//
//   meson test -C build checkpoint
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sharded_checkpoint.h"
#include "stages/sharded_test_fixture.h"
#include "test_util.h"
#include "zero3.h"

namespace zf {
namespace {

namespace fs = std::filesystem;
using test::expect_has;
using test::refusal;

// Each rank's file carries its save's id, as does the index: a file of
// another run (same model, step and ranks, another seed) copied into a
// committed step folder is refused, not mixed into the resumed model.
TEST_F(ShardedCheckpoint, AFileFromAnotherSaveIsRefused) {
  TrainConfig cfg = saving_sharded(path("ck"));
  run_training(cfg, train_zero3);
  TrainConfig other = cfg;
  other.seed = 7;
  other.save = path("other");
  run_training(other, train_zero3);
  const std::string file = "/step-00000002/rank-00001-of-00002.safetensors";
  fs::copy_file(path("other") + file, path("ck") + file, fs::copy_options::overwrite_existing);
  expect_has(refusal([&] { ShardedCheckpointReader(path("ck"), build_layout(cfg.model)); }),
             {path("ck") + file, "says save '", "from another save"});
  TrainConfig resume = cfg;
  resume.resume = path("ck");
  resume.steps = 3;
  expect_has(refusal([&] { run_training(resume, train_zero3); }), {"from another save"});
}

// A save follows no link in its folder: a step folder that is a link to
// another folder is refused, and what it points to is left whole.
TEST_F(ShardedCheckpoint, ASaveFollowsNoLinkInItsFolder) {
  TrainConfig cfg = saving_sharded(path("ck"));
  fs::create_directories(path("victim"));
  { std::ofstream(path("victim/rank-00000-of-00002.safetensors")) << "mine"; }
  fs::create_directories(path("ck"));
  fs::create_directory_symlink("../victim", path("ck/step-00000002"));
  try {
    run_training(cfg, train_zero3);
    ADD_FAILURE() << "the save went ahead";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step-00000002 is a symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_EQ(entries(path("victim")), (std::vector<std::string>{"rank-00000-of-00002.safetensors"}));
  EXPECT_EQ(bytes_of(path("victim/rank-00000-of-00002.safetensors")), "mine");
  // A rank file that is a link, in a save's own unfinished step folder, is left too.
  fs::remove(path("ck/step-00000002"));
  fs::create_directory(path("ck/step-00000002"));
  fs::create_symlink("../../victim/rank-00000-of-00002.safetensors", path("ck/step-00000002/rank-00000-of-00002.safetensors"));
  EXPECT_THROW(run_training(cfg, train_zero3), Error);
  EXPECT_EQ(bytes_of(path("victim/rank-00000-of-00002.safetensors")), "mine");
  EXPECT_TRUE(fs::is_symlink(path("ck/step-00000002/rank-00000-of-00002.safetensors")));
}

// One run at a time saves into a folder: a second is refused before step 0,
// naming the first, and the first's files are untouched; once the first
// ends (its lock goes with its process) the folder can be used again.
TEST_F(ShardedCheckpoint, ASecondWriterIsRefused) {
  TrainConfig cfg = saving_sharded(path("ck"));
  run_training(cfg, train_zero3);
  TrainConfig more = cfg;
  more.resume = path("ck");
  more.steps = 4;
  {
    // Another process's lock, as a live run holds it.
    const int fd = ::open(path("ck/lock").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 0), 0);
    ASSERT_EQ(::write(fd, "pid 4242 on elsewhere\n", 22), 22);
    const pid_t child = ::fork();
    if (child == 0) {
      ::flock(fd, LOCK_EX);
      ::pause();
      ::_exit(0);
    }
    ::close(fd);
    auto held = [&] {
      const int probe = ::open(path("ck/lock").c_str(), O_RDONLY);
      const bool free = ::flock(probe, LOCK_EX | LOCK_NB) == 0;
      ::close(probe);
      return !free;
    };
    for (int i = 0; i < 500 && !held(); ++i) ::usleep(10000);  // until the child holds it
    expect_has(refusal([&] { run_training(more, train_zero3); }),
               {"--save " + path("ck"), "being written by another run", "pid 4242 on elsewhere"});
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  }
  EXPECT_EQ(entries(path("ck")), (std::vector<std::string>{"latest", "lock", "step-00000002"}));
  run_training(more, train_zero3);
  EXPECT_EQ(bytes_of(path("ck/latest")), "step-00000004\n");
  // A file of the user's named lock is neither locked nor overwritten.
  fs::create_directories(path("mine"));
  { std::ofstream(path("mine/lock")) << "my notes"; }
  TrainConfig mine = cfg;
  mine.save = path("mine");
  expect_has(refusal([&] { run_training(mine, train_zero3); }), {"mine/lock", "no save wrote"});
  EXPECT_EQ(bytes_of(path("mine/lock")), "my notes");
}

// `latest` naming a step folder without a committed checkpoint is refused
// as --save: a save would replace the only pointer the user has.
TEST_F(ShardedCheckpoint, ALatestNamingNoCheckpointIsRefusedAsSave) {
  TrainConfig cfg = saving_sharded(path("ck"));
  fs::create_directories(path("ck"));
  { std::ofstream(path("ck/latest")) << "step-00000001\n"; }
  expect_has(refusal([&] { run_training(cfg, train_zero3); }), {"latest names step-00000001", "no committed"});
  EXPECT_EQ(bytes_of(path("ck/latest")), "step-00000001\n");
}

}  // namespace
}  // namespace zf
