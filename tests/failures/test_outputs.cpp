// test_outputs.cpp: nothing a run is given is lost to what it writes. The
// real `dp` (and stage 05's `offload`) executable: an output that is also
// an input or another output, by any name (./, a symlink, a hard link), is
// refused with exit code 2 naming both flags, before anything is read or
// written; an output that cannot be created (no such folder, a directory, a
// FIFO, a device) is refused before step 0. Every case checks that the
// inputs hash the same afterwards and that no file was created.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "hardware.h"
#include "test_util.h"

namespace zf {
namespace {

namespace fs = std::filesystem;
using test::run_command;

std::string dp() { return "timeout 120 " + test::dp_binary() + " --model tiny --batch 1"; }

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

size_t hash_of(const std::string& p) { return std::hash<std::string>{}(read_all(p)) ^ fs::file_size(p); }

class Outputs : public test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    data_ = path("tokens.txt");
    std::ofstream(data_) << std::string(4096, 'a') << "the quick brown fox jumps over the lazy dog\n";
    ck_ = path("ck.safetensors");
    auto r = run_command(dp() + " --quiet --steps 2 --save " + ck_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  // Every name in the folder, recursively (symlinks as names).
  std::set<std::string> listing() const {
    std::set<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) names.insert(e.path().string());
    return names;
  }
  // Runs dp with `args`, expecting exit code 2 with every word of `words`
  // in the output, no step trained, the inputs unchanged and no new file.
  void expect_refused(const std::string& args, const std::vector<std::string>& words,
                      const std::string& exe = "") {
    const size_t data_hash = hash_of(data_), ck_hash = hash_of(ck_);
    const std::set<std::string> before = listing();
    auto r = run_command((exe.empty() ? dp() : exe) + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    for (const auto& w : words) EXPECT_NE(r.output.find(w), std::string::npos) << "'" << w << "' missing for "
                                                                                << args << ":\n" << r.output;
    EXPECT_EQ(r.output.find("step     1/"), std::string::npos) << "trained before refusing: " << r.output;
    EXPECT_EQ(hash_of(data_), data_hash) << args << ": --data's file changed";
    EXPECT_EQ(hash_of(ck_), ck_hash) << args << ": the checkpoint changed";
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(ck_))) << args;
    EXPECT_EQ(listing(), before) << args << ": a file was created or removed";
  }
  std::string data_, ck_;
};

// --- outputs that are inputs, or each other --------------------------------

TEST_F(Outputs, OutputThatIsAnInputIsRefused) {
  const std::string& ck = ck_;
  const std::string dot = dir_ + "/./ck.safetensors";
  fs::create_symlink("ck.safetensors", path("link.safetensors"));
  fs::create_hard_link(ck, path("hard.safetensors"));
  const std::string link = path("link.safetensors"), hard = path("hard.safetensors");
  for (const std::string out : {"--log-json", "--save", "--trace", "--save-init"})
    for (const std::string& name : {ck, dot, link, hard}) {
      expect_refused("--steps 4 --resume " + ck + " " + out + " " + name, {out, "--resume"});
      expect_refused("--steps 2 --init " + ck + " " + out + " " + name, {out, "--init"});
    }
  const std::string dot_data = dir_ + "/./tokens.txt";
  for (const std::string out : {"--log-json", "--save", "--trace", "--save-init"}) {
    expect_refused("--steps 2 --data " + data_ + " " + out + " " + data_, {out, "--data"});
    expect_refused("--steps 2 --data " + data_ + " " + out + " " + dot_data, {out, "--data"});
  }
}

// A sharded checkpoint is a folder of files the run reads: its `latest`,
// the step's index and every rank's file. None may be an output, by any
// name; nor may an output land where a sharded --save writes.
TEST_F(Outputs, OutputOntoAShardedCheckpointsFileIsRefused) {
  const std::string sk = path("sk"), step = sk + "/step-00000002";
  auto r = run_command(dp() + " --quiet --steps 2 --ranks 2 --save " + sk + " --save-format sharded");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string rank = step + "/rank-00000-of-00002.safetensors";
  fs::create_symlink(rank, path("link.st"));
  fs::create_hard_link(rank, path("hard.st"));
  std::vector<std::pair<std::string, size_t>> files;
  for (const auto& e : fs::recursive_directory_iterator(sk))
    if (e.is_regular_file()) files.emplace_back(e.path().string(), hash_of(e.path().string()));
  const std::vector<std::string> targets = {rank,           step + "/index.json", sk + "/latest", sk + "/lock",
                                            path("link.st"), path("hard.st"),
                                            step + "/./rank-00001-of-00002.safetensors"};
  // Each file under each input flag, through each output flag in turn (one
  // check serves every output flag: each flag meets several of the files).
  const std::vector<std::string> outs = {"--save", "--save-init", "--log-json", "--trace"};
  for (size_t i = 0; i < targets.size(); ++i) {
    const std::string& t = targets[i];
    const std::string& a = outs[i % outs.size()], & b = outs[(i + 1) % outs.size()];
    expect_refused("--ranks 2 --steps 4 --resume " + sk + " " + a + " " + t, {a, "--resume " + sk, "reads"});
    expect_refused("--ranks 2 --steps 2 --init " + sk + " " + b + " " + t, {b, "--init " + sk, "reads"});
  }
  expect_refused("--ranks 2 --steps 4 --resume " + step + " --save " + rank, {"--save", "--resume " + step});
  // A step folder named directly: the latest and lock of the folder holding it are kept whole too.
  for (const std::string& t : {sk + "/latest", sk + "/lock"})
    expect_refused("--ranks 2 --steps 2 --init " + step + "/ --log-json " + t, {"--log-json", "--init " + step});
  // Where a sharded save writes: its latest, its lock, its step folders.
  const std::string fresh = path("fresh");
  for (const std::string out : {"--save-init", "--log-json", "--trace"}) {
    for (const std::string& t : {fresh + "/latest", fresh + "/lock", fresh + "/step-00000004/run.log"})
      expect_refused("--ranks 2 --steps 4 --save " + fresh + " --save-format sharded " + out + " " + t,
                     {out, "where --save " + fresh + " writes"});
    expect_refused("--ranks 2 --steps 4 --resume " + sk + " --save " + sk + " --save-format sharded " + out + " " +
                       sk + "/step-00000004/run.log",
                   {out, "where --save " + sk + " writes"});
  }
  // A run refused by the folder's own checks leaves its lock as it was.
  expect_refused("--ranks 2 --steps 2 --save " + sk + " --save-format sharded", {"--save", "already holds"});
  for (const auto& [file, hash] : files) EXPECT_EQ(hash_of(file), hash) << file << " changed";
  // Beside them, the same run goes ahead.
  r = run_command(dp() + " --quiet --ranks 2 --steps 4 --resume " + sk + " --save " + sk +
                  " --save-format sharded --log-json " + sk + "/run.jsonl");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// --hardware's profile is read like any input: no output may be it.
TEST_F(Outputs, OutputOntoTheHardwareProfileIsRefused) {
  const std::string hw = path("prof.hw");
  fs::copy_file(hardware_dir() + "/h200.hw", hw);
  fs::create_symlink("prof.hw", path("link.hw"));
  const size_t before = hash_of(hw);
  for (const std::string out : {"--save", "--save-init", "--log-json", "--trace"})
    for (const std::string& t : {hw, path("link.hw")})
      expect_refused("--steps 2 --clock modeled --hardware " + hw + " " + out + " " + t, {out, "--hardware"});
  EXPECT_EQ(hash_of(hw), before);
}

TEST_F(Outputs, TwoOutputsOnOneFileAreRefused) {
  const std::string f = path("out.file");
  const std::string flags[] = {"--save", "--save-init", "--log-json", "--trace"};
  for (size_t i = 0; i < 4; i++)
    for (size_t j = i + 1; j < 4; j++) {
      // Neither exists yet: the same folder and name.
      expect_refused("--steps 2 " + flags[i] + " " + f + " " + flags[j] + " " + dir_ + "/./out.file",
                     {flags[i], flags[j]});
      // A dangling symlink names the file a write would create.
      fs::remove(path("link"));
      fs::create_symlink("out.file", path("link"));
      expect_refused("--steps 2 " + flags[i] + " " + path("link") + " " + flags[j] + " " + f,
                     {flags[i], flags[j]});
    }
}

// Stage 05's --offload-dir is a folder the run fills: no output may be it.
TEST_F(Outputs, OutputThatIsTheOffloadDirIsRefused) {
  const std::string off = path("offload");
  fs::create_directory(off);
  const std::string exe = "timeout 120 " + test::offload_binary() + " --model tiny --batch 1";
  expect_refused("--steps 2 --offload-dir " + off + " --log-json " + off, {"--log-json", "--offload-dir"}, exe);
  expect_refused("--steps 2 --offload-dir " + off + " --save " + dir_ + "/./offload", {"--save", "--offload-dir"},
                 exe);
}

// The run creates and removes folders under --offload-dir: no input or
// output may lie in it, at any depth, by any name (the reproduction: a
// checkpoint named as an offload file, resumed from inside the folder).
TEST_F(Outputs, InputsAndOutputsInTheOffloadDirAreRefused) {
  const std::string off = path("offload");
  fs::create_directories(off + "/sub");
  const std::string exe = "timeout 120 " + test::offload_binary() + " --model tiny --batch 1";
  const std::string inside = off + "/zf-offload-999999-bb-r0-m.bin", deeper = off + "/sub/ck.st";
  fs::copy_file(ck_, inside);
  fs::copy_file(ck_, deeper);
  fs::copy_file(data_, off + "/tokens.txt");
  fs::create_symlink("offload", path("alias"));
  for (const std::string& in : {inside, deeper, path("alias") + "/sub/ck.st"}) {
    expect_refused("--steps 6 --offload-dir " + off + " --resume " + in, {"--resume", "lies in --offload-dir"}, exe);
    expect_refused("--steps 6 --offload-dir " + off + " --init " + in, {"--init", "lies in --offload-dir"}, exe);
  }
  expect_refused("--steps 2 --offload-dir " + off + " --data " + off + "/tokens.txt", {"--data", "lies in"}, exe);
  for (const std::string out : {"--save", "--save-init", "--log-json", "--trace"}) {
    expect_refused("--steps 2 --offload-dir " + off + " " + out + " " + off + "/new.file", {out, "lies in"}, exe);
    expect_refused("--steps 2 --offload-dir " + path("alias") + " " + out + " " + off + "/sub/new.file",
                   {out, "lies in"}, exe);
  }
  // Beside the folder, not in it: fine.
  auto r = run_command(exe + " --quiet --steps 3 --offload-dir " + off + " --resume " + ck_ + " --save " +
                       path("next.st"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// --- outputs that cannot be written, refused before step 0 ----------------

TEST_F(Outputs, UnwritableOutputsAreRefusedBeforeStepZero) {
  for (const std::string flag : {"--save", "--save-init", "--log-json", "--trace"}) {
    expect_refused("--steps 20 " + flag + " " + path("no-such-dir/out.file"), {flag, "does not exist"});
    expect_refused("--steps 20 " + flag + " " + dir_, {flag, "is a directory"});
    expect_refused("--steps 20 " + flag + " " + data_ + "/out.file", {flag, "not a directory"});
  }
}

TEST_F(Outputs, SpecialFilesAreRefusedAndLeftAlone) {
  const std::string fifo = path("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  for (const std::string flag : {"--save", "--save-init", "--log-json", "--trace"})
    expect_refused("--steps 20 " + flag + " " + fifo, {flag, "FIFO"});
  EXPECT_TRUE(fs::is_fifo(fifo));
  // A device node like /dev/full, made here (root, or CAP_MKNOD, only) so
  // that a run which replaces it costs the machine nothing.
  const std::string dev = path("full");
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0)
    GTEST_SKIP() << "cannot make a device node here (" << std::strerror(errno) << "): the FIFO cases ran";
  for (const std::string flag : {"--save", "--save-init", "--log-json", "--trace"})
    expect_refused("--steps 20 " + flag + " " + dev, {flag, "character device"});
  struct stat st {};
  ASSERT_EQ(::lstat(dev.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the device node was replaced";
}

TEST_F(Outputs, ReadOnlyFolderIsRefusedBeforeStepZero) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a read-only folder: nothing to refuse";
  const std::string ro = path("ro");
  fs::create_directory(ro);
  std::ofstream(ro + "/old.safetensors") << "x";
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  for (const std::string flag : {"--save", "--log-json"}) {
    expect_refused("--steps 20 " + flag + " " + ro + "/new.file", {flag, "Permission denied"});
  }
  // The file exists and is writable, but the save renames a temporary into
  // the folder, which needs the folder writable.
  fs::permissions(ro + "/old.safetensors", fs::perms::owner_read | fs::perms::owner_write);
  expect_refused("--steps 20 --save " + ro + "/old.safetensors", {"--save", "Permission denied"});
  fs::permissions(ro, fs::perms::owner_all);
}

// A name the file system takes, but not with the save's temporary suffix:
// refused before step 0, saying how long a name may be.
TEST_F(Outputs, ASaveNameTooLongForItsTemporaryIsRefused) {
  const std::string name = path(std::string(253, 's'));
  expect_refused("--steps 2 --save " + name, {"--save", "the temporary", "too long for this file system",
                                              "choose a file name of at most"});
  // The length it says is one that works.
  auto r = run_command(dp() + " --steps 2 --save " + name + " 2>&1 | head -c 2000");
  const size_t at = r.output.find("at most ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const size_t most = std::stoul(r.output.substr(at + 8));
  const std::string fits = path(std::string(most, 'f'));
  r = run_command(dp() + " --quiet --steps 2 --save " + fits);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(fits));
}

// --- what must still work -------------------------------------------------

// A symlink --save writes its target (the link stays); the log and the
// trace in the same folder are fine; resuming from the link works.
TEST_F(Outputs, SaveThroughASymlinkWritesItsTarget) {
  const std::string target = path("target.safetensors"), link = path("link.safetensors");
  fs::create_symlink("target.safetensors", link);
  auto r = run_command(dp() + " --quiet --steps 2 --save " + link + " --log-json " + path("run.jsonl") +
                       " --trace " + path("t.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::is_symlink(link)) << "the link was replaced by a file";
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(target)));
  r = run_command(dp() + " --steps 3 --resume " + link);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace zf
