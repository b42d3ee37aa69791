// test_cli.cpp: bad input to the `dp` executable gives one clear message and
// a non-zero exit, never a crash, a hang or a silent default. Each case runs
// the real binary and checks both the exit code and the words of the message.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "device.h"
#include "test_util.h"

namespace zf {
namespace {

using test::run_command;

std::string dp() { return test::dp_binary() + " --model tiny --steps 1 --batch 1 --quiet"; }

void expect_usage_error(const std::string& args, const std::vector<std::string>& words) {
  auto r = run_command(dp() + " " + args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  for (const auto& w : words) EXPECT_NE(r.output.find(w), std::string::npos) << "'" << w << "' missing for "
                                                                              << args << ":\n" << r.output;
  // One message, not a stack of them, and no crash report.
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_LE(std::count(r.output.begin(), r.output.end(), '\n'), 2) << r.output;
}

TEST(Cli, ValidRunSucceeds) {
  auto r = run_command(dp() + " --ranks 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// --quiet prints nothing on stdout, as its help says, even when resuming;
// the run log still gets every step and the summary.
TEST(Cli, QuietPrintsNothingOnStdout) {
  const std::string dir = test::temp_dir();
  // In a subshell: run_command's own 2>&1 comes after, and would win.
  auto saved = run_command("(" + dp() + " --save " + dir + "/ck.st 2>/dev/null)");
  ASSERT_EQ(saved.exit_code, 0);
  EXPECT_EQ(saved.output, "");
  auto resumed = run_command("(" + dp() + " --ranks 2 --steps 3 --resume " + dir + "/ck.st --log-json " + dir +
                             "/log.jsonl 2>/dev/null)");
  EXPECT_EQ(resumed.exit_code, 0);
  EXPECT_EQ(resumed.output, "");
  std::ifstream in(dir + "/log.jsonl");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4) << text;  // the load, steps 1, 2 and the summary
  EXPECT_NE(text.find("\"summary\""), std::string::npos);
  std::filesystem::remove_all(dir);
  // And the help says so.
  auto help = run_command(test::dp_binary() + " --help");
  EXPECT_NE(help.output.find("print nothing on stdout"), std::string::npos) << help.output;
}

// Every step line but the last says how long the rest will take; the last
// says how long the steps took.
TEST(Cli, StepLinesShowTimeLeftThenTimeTaken) {
  auto r = run_command(test::dp_binary() + " --model tiny --steps 3 --batch 1 --log-every 1 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> steps;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("step ", 0) == 0) steps.push_back(line);
  ASSERT_EQ(steps.size(), 3u) << r.output;
  EXPECT_NE(steps[0].find("| ETA "), std::string::npos) << steps[0];
  EXPECT_NE(steps[1].find("| ETA "), std::string::npos) << steps[1];
  EXPECT_NE(steps[2].find("| took "), std::string::npos) << steps[2];
  EXPECT_EQ(steps[2].find("ETA"), std::string::npos) << steps[2];
}

TEST(Cli, ZeroRanks) { expect_usage_error("--ranks 0", {"--ranks", "got 0"}); }
TEST(Cli, UnknownPreset) { expect_usage_error("--model huge", {"huge", "tiny, wide, small, gpt2, gpt2-medium"}); }
TEST(Cli, ABadShape) {
  expect_usage_error("--model L=2,C=64,H=4,T=64", {"'L=2,C=64,H=4,T=64'", "without V=", "all five"});
  expect_usage_error("--model tiny,C=66", {"H=4 must divide the channels C=66"});
}
TEST(Cli, ZeroBatch) { expect_usage_error("--batch 0", {"--batch", "got 0"}); }
TEST(Cli, NotANumber) { expect_usage_error("--steps many", {"--steps", "many"}); }
TEST(Cli, UnknownFlag) { expect_usage_error("--zero-stage 3", {"--zero-stage"}); }
TEST(Cli, BadPrecision) { expect_usage_error("--precision fp16", {"--precision", "fp16"}); }
TEST(Cli, MalformedSize) { expect_usage_error("--device-mem 12XB", {"--device-mem", "12XB"}); }
TEST(Cli, BadCompute) { expect_usage_error("--compute fp16", {"--compute", "fp16"}); }
TEST(Cli, Bf16ComputeNeedsBf16Recipe) {
  expect_usage_error("--compute bf16 --precision fp32", {"--compute bf16", "--precision bf16"});
}

// --compute auto is f32 on the CPU (bf16 only on a GPU), and an explicit
// bf16 runs the CPU's emulation; the run log says which (and the attention form).
TEST(Cli, ComputeDtypeInRunLog) {
  const std::string dir = test::temp_dir();
  for (const auto& [flags, want] : {std::pair{"--precision bf16", "\"compute\":\"f32\""},
                                    std::pair{"--precision bf16 --compute bf16", "\"compute\":\"bf16\""}}) {
    const std::string log = dir + "/run.jsonl";
    auto r = run_command(dp() + " " + flags + " --log-json " + log);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find(want), std::string::npos) << flags << ":\n" << text;
    EXPECT_NE(text.find("\"attention\":\"simple\""), std::string::npos) << text;  // the CPU's one form
  }
}

// ZF_PROFILE=1 prints rank 0's op table (device_profile.h) and changes
// nothing else: the final parameters hash the same as without it.
TEST(Cli, ProfileTableLeavesResultsAlone) {
  const std::string args = " --ranks 2 --steps 2 --precision bf16";
  auto plain = run_command(test::dp_binary() + " --model tiny --batch 1" + args);
  auto prof = run_command("ZF_PROFILE=1 " + test::dp_binary() + " --model tiny --batch 1" + args);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(prof.exit_code, 0) << prof.output;
  EXPECT_EQ(plain.output.find("op profile"), std::string::npos);
  for (const char* op : {"op profile", "matmul_forward", "attention_backward", "adamw", "sum_squares"})
    EXPECT_NE(prof.output.find(op), std::string::npos) << op << " missing:\n" << prof.output;
  // One table (rank 0's), not one per rank.
  EXPECT_EQ(prof.output.find("op profile"), prof.output.rfind("op profile")) << prof.output;
  auto hash = [](const std::string& out) { return out.substr(out.rfind("hash")); };
  EXPECT_EQ(hash(plain.output), hash(prof.output));
}

TEST(Cli, CudaUnavailableSaysWhy) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is here (this checks the refusal without one)";
  expect_usage_error("--device cuda", {"--device cuda", "CUDA"});
}

// A dry run runs on no GPU: --device cuda is refused for that reason, not for a missing GPU.
TEST(Cli, ADryRunOnCudaSaysItRunsOnNone) {
  expect_usage_error("--device cuda --dry-run --clock modeled", {"--dry-run", "leave out --device cuda"});
}

TEST(Cli, MissingDataFile) {
  expect_usage_error("--data /nonexistent/tokens.bin", {"/nonexistent/tokens.bin"});
}

TEST(Cli, DataFileShorterThanTPlus2) {
  // tiny has T = 64: 65 tokens are one too few, 66 are enough.
  std::string dir = test::temp_dir();
  for (int n : {65, 66}) {
    std::string path = dir + "/short" + std::to_string(n) + ".txt";
    std::ofstream(path) << std::string(n, 'a');
    if (n == 65) expect_usage_error("--data " + path, {path, "65", "66"});
    else EXPECT_EQ(run_command(dp() + " --data " + path).exit_code, 0);
  }
}

// A token id past every preset's vocabulary: no --model to suggest, the
// file was tokenized for another one. (An id past tiny's still names gpt2.)
TEST(Cli, TokenBeyondEveryVocabularySaysRetokenize) {
  const std::string dir = test::temp_dir(), path = dir + "/wide.bin";
  {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;  // llm.c's magic number, version 1, token count
    header[1] = 1;
    header[2] = 2000;
    std::vector<uint16_t> tokens(2000, 7);
    tokens[1500] = 65535;
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    f.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
  }
  auto r = run_command(test::dp_binary() + " --model gpt2 --steps 1 --batch 1 --quiet --data " + path);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("token id 65535"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no preset's vocabulary covers it"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("use a --model"), std::string::npos) << r.output;
  r = run_command(dp() + " --data " + path);
  EXPECT_NE(r.output.find("gpt2 has 50304"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

// A token file larger than memory (here: than an address-space limit) is
// named, with its size, instead of a bare std::bad_alloc.
TEST(Cli, DataFileLargerThanMemoryIsNamed) {
  const std::string limit = test::address_space_limit("4000000");  // room for OpenBLAS's buffers
  if (limit.empty()) GTEST_SKIP() << "a sanitizer build reserves terabytes of address space: no limit to set";
  const std::string dir = test::temp_dir(), path = dir + "/huge.txt";
  { std::ofstream(path) << "x"; }
  std::filesystem::resize_file(path, uintmax_t(8) << 30);  // sparse: no disk space taken
  auto r = run_command(limit + "timeout -s KILL 60 " + dp() + " --data " + path);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("token file '" + path + "' (8589934592 bytes) does not fit in this machine's memory"),
            std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

TEST(Cli, InitFileOfAnotherModel) {
  std::string dir = test::temp_dir();
  std::string path = dir + "/small.safetensors";
  auto r = run_command(test::dp_binary() + " --model small --steps 0 --quiet --save-init " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // small has C = 128 and L = 4, tiny C = 64 and L = 2: the shapes differ.
  expect_usage_error("--init " + path, {path, "wte.weight", "[256, 128]", "[256, 64]"});
}

TEST(Cli, InitFileNotSafetensors) {
  std::string dir = test::temp_dir();
  std::string path = dir + "/junk.safetensors";
  std::ofstream(path) << "this is not a checkpoint";
  expect_usage_error("--init " + path, {path});
}

TEST(Cli, BadAttention) { expect_usage_error("--attention fast", {"--attention", "fast"}); }
// On the CPU, --attention flash runs the GPU kernels' code one thread at a
// time; the run log says which form ran.
TEST(Cli, FlashAttentionRunsOnTheCpuAndIsLogged) {
  const std::string log = test::temp_dir() + "/run.jsonl";
  auto r = run_command(dp() + " --attention flash --log-json " + log);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"attention\":\"flash\""), std::string::npos) << text;
}

TEST(Cli, BadRecompute) {
  expect_usage_error("--recompute selective", {"--recompute", "selective", "none, full or attn"});
}
// The run log says which recomputation ran.
TEST(Cli, RecomputeIsLogged) {
  const std::string log = test::temp_dir() + "/run.jsonl";
  auto r = run_command(dp() + " --recompute attn --log-json " + log);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"recompute\":\"attn\""), std::string::npos) << text;
}

TEST(Cli, BadLrSchedule) {
  expect_usage_error("--lr-schedule step", {"--lr-schedule", "step", "constant, cosine or linear"});
}
TEST(Cli, NegativeWarmup) { expect_usage_error("--warmup -1", {"--warmup", "got -1"}); }
TEST(Cli, SaveFormatIsOneOfTwoAndNeedsSave) {
  expect_usage_error("--save ck --save-format zip", {"--save-format", "zip", "consolidated or sharded"});
  expect_usage_error("--save-format sharded", {"--save-format", "--save"});
  expect_usage_error("--save ck --save-async", {"--save-async", "--save-format sharded"});
}

TEST(Cli, MinLrAboveLr) { expect_usage_error("--lr-schedule cosine --min-lr 1e-3", {"--min-lr", "--lr", "0.001"}); }
// The bound is inclusive: a decay to --lr itself (no decay) trains.
TEST(Cli, MinLrAtLrIsAccepted) {
  auto r = run_command(dp() + " --lr-schedule linear --lr 1e-3 --min-lr 1e-3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}
TEST(Cli, MinLrNeedsADecay) { expect_usage_error("--min-lr 1e-5", {"--min-lr", "constant", "cosine"}); }
TEST(Cli, NegativeWeightDecay) { expect_usage_error("--weight-decay -0.1", {"--weight-decay", "-0.1"}); }
TEST(Cli, NonNumberWeightDecay) { expect_usage_error("--weight-decay nan", {"--weight-decay", "nan"}); }

TEST(Cli, NegativeValEvery) { expect_usage_error("--val-every -1", {"--val-every", "got -1"}); }
TEST(Cli, ZeroValBatches) { expect_usage_error("--val-every 1 --val-batches 0", {"--val-batches", "got 0"}); }
TEST(Cli, MissingValData) {
  expect_usage_error("--val-every 1 --val-data /nonexistent/val.bin", {"--val-data", "/nonexistent/val.bin"});
}
TEST(Cli, ValEveryInADryRun) {
  expect_usage_error("--clock modeled --dry-run --val-every 1", {"--val-every", "--dry-run"});
}
// --val-data is an input: the run log may not be written over it.
TEST(Cli, ValDataIsNotAnOutput) {
  const std::string dir = test::temp_dir(), val = dir + "/val.bin";
  std::ofstream(val) << std::string(1000, 'a');
  expect_usage_error("--val-every 1 --val-data " + val + " --log-json " + val, {"--val-data", "--log-json"});
  std::ifstream in(val);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), std::string(1000, 'a'));
  std::filesystem::remove_all(dir);
}
// Data too short to hold out a tenth trains on all of it, and is refused
// only when validation is asked for, saying to give --val-data.
TEST(Cli, DataTooShortForAValidationTenth) {
  const std::string dir = test::temp_dir(), data = dir + "/short.bin";
  std::ofstream(data) << std::string(500, 'a');  // a tenth is 50 < T + 2 = 66 (tiny)
  auto r = run_command(dp() + " --data " + data);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_usage_error("--val-every 1 --data " + data, {"--val-every", "500", "--val-data"});
  std::filesystem::remove_all(dir);
}

TEST(Cli, SampleFlagsAreChecked) {
  expect_usage_error("--sample-every -2", {"--sample-every", "got -2"});
  expect_usage_error("--sample-every 1 --sample-prompt ''", {"--sample-prompt"});
  expect_usage_error("--sample-every 1 --sample-length 0", {"--sample-length", "got 0"});
  expect_usage_error("--sample-every 1 --temperature -1", {"--temperature", "got -1"});
  expect_usage_error("--sample-every 1 --top-k -3", {"--top-k", "got -3"});
  expect_usage_error("--clock modeled --dry-run --sample-every 1", {"--sample-every", "--dry-run"});
}
// --steps 0 --init FILE --sample-every 1: the saved model writes a sample,
// on stdout and in the run log, and nothing is trained.
TEST(Cli, GeneratesFromASavedModel) {
  const std::string dir = test::temp_dir(), ck = dir + "/ck.safetensors", log = dir + "/gen.jsonl";
  ASSERT_EQ(run_command(dp() + " --steps 3 --save " + ck).exit_code, 0);
  auto r = run_command(test::dp_binary() + " --model tiny --steps 0 --init " + ck +
                       " --sample-every 1 --sample-prompt 'Once' --sample-length 8 --log-json " + log);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sample after 0 steps ----\nOnce"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\nstep "), std::string::npos) << r.output;  // no step line
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("{\"sample\":{\"after_step\":0,\"prompt\":\"Once\",\"text\":"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

TEST(Cli, SaveEveryNeedsSave) { expect_usage_error("--save-every 5", {"--save-every", "--save FILE"}); }
TEST(Cli, SaveWithNoStepsSaysToUseSaveInit) {
  expect_usage_error("--steps 0 --save ck.safetensors", {"--steps 0", "--save-init"});
}
TEST(Cli, ResumeAndInitExcludeEachOther) {
  expect_usage_error("--init a.safetensors --resume b.safetensors", {"--resume", "--init"});
}

// The whole cycle through the binary: save, resume, and a truncated
// checkpoint refused with exit code 2 and the file named.
TEST(Cli, SaveThenResume) {
  const std::string dir = test::temp_dir(), ck = dir + "/ck.safetensors";
  auto r = run_command(dp() + " --steps 2 --save " + ck);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command(test::dp_binary() + " --model tiny --batch 1 --steps 3 --resume " + ck);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming from " + ck + " at step 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step     2/3"), std::string::npos) << r.output;
  std::filesystem::resize_file(ck, std::filesystem::file_size(ck) / 2);
  expect_usage_error("--steps 3 --resume " + ck, {ck, "truncated"});
}

TEST(Cli, OutOfMemoryExitsWithItsOwnCode) {
  auto r = run_command(dp() + " --device-mem 512KiB");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("out of memory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("512.00 KiB"), std::string::npos) << r.output;
  // Every error starts the same way: "dp: error: ..."
  EXPECT_NE(r.output.find("dp: error: rank 0 failed: out of memory"), std::string::npos) << r.output;
}

TEST(Cli, InjectedFaultNamesTheRank) {
  auto r = run_command("timeout 60 " + dp() + " --ranks 3 --steps 3 --inject-fault 1:1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
}

// Input files must be regular files, refused before they are opened: a
// FIFO with no writer would block the open forever, and /dev/zero never
// ends. The memory limit and `timeout 20` turn a regression into a
// failure, not a hung or swapping suite.
TEST(Cli, SpecialFilesAsInputAreRefused) {
  const std::string dir = test::temp_dir(), fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto refused = [&](const std::string& args, const std::vector<std::string>& words) {
    auto r = run_command(test::address_space_limit("4000000") + "timeout 20 " + dp() + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    for (const auto& w : words)
      EXPECT_NE(r.output.find(w), std::string::npos) << "'" << w << "' missing for " << args << ":\n" << r.output;
  };
  refused("--data /dev/zero", {"--data", "/dev/zero", "character device", "regular file"});
  refused("--data " + fifo, {"--data", fifo, "FIFO"});
  refused("--data " + dir, {"--data", dir, "directory"});
  refused("--steps 3 --resume " + fifo, {"--resume", fifo, "FIFO"});
  refused("--init " + fifo, {"--init", fifo, "FIFO"});
  refused("--init /dev/zero", {"--init", "/dev/zero", "character device"});
}

// A rank that the run does not have cannot fail: the fault would never fire.
TEST(Cli, InjectFaultOnARankOutsideTheWorld) {
  expect_usage_error("--ranks 1 --inject-fault 9:1", {"--inject-fault", "rank 9", "1 rank"});
  expect_usage_error("--ranks 2 --inject-fault -1:1", {"--inject-fault", "-1"});
}

// Seeds are 0 .. 2^64-1: a negative one or one past the range is refused,
// not wrapped or clamped to 2^64-1.
TEST(Cli, SeedOutOfRange) {
  expect_usage_error("--seed -1", {"--seed", "-1", "18446744073709551615"});
  expect_usage_error("--seed 99999999999999999999", {"--seed", "99999999999999999999", "18446744073709551615"});
  EXPECT_EQ(run_command(dp() + " --steps 0 --seed 18446744073709551615").exit_code, 0);
}

// An explicitly empty value is a mistake (an unset shell variable), not
// "flag not given".
TEST(Cli, EmptyValuesAreRefused) {
  for (const char* flag : {"--device-mem", "--data", "--log-json", "--resume", "--init", "--save-init", "--save",
                           "--trace"})
    expect_usage_error(std::string(flag) + " ''", {flag, "empty"});
  const char* offload = std::getenv("ZF_OFFLOAD_BIN");
  const std::string bin = offload ? offload : "build/05_offload/offload";
  auto r = run_command(bin + " --model tiny --steps 1 --batch 1 --quiet --offload-dir ''");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--offload-dir"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("empty"), std::string::npos) << r.output;
}

// Every flag that takes a value refuses an empty one, numbers too (CLI11
// alone reads an empty number as 0), in every program.
TEST(Cli, EmptyValuesAreRefusedByEveryFlag) {
  for (const char* flag : {"--temperature", "--min-lr", "--weight-decay", "--lr", "--steps", "--sample-seed",
                           "--seed", "--model", "--hardware", "--val-data", "--comm-timeout", "--inject-fault"})
    expect_usage_error(std::string(flag) + " ''", {flag, "empty"});
  const char* estimate = std::getenv("ZF_MEMORY_ESTIMATE_BIN");
  const std::string tool = estimate ? estimate : "build/tools/memory_estimate";
  for (const char* flag : {"--hardware", "--params", "--batch", "--fit", "--data"}) {
    auto r = run_command(tool + " --model tiny " + flag + " ''");
    EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find(std::string(flag) + ": the value is empty"), std::string::npos) << r.output;
  }
}

// Every number is decimal and in range, or refused naming the flag and the
// value: CLI11 alone reads 0x10 as hex (0x1p-2 as a hex float), wraps -1
// to 2^64-1 and clamps what is past it.
TEST(Cli, NumbersAreDecimalAndInRange) {
  expect_usage_error("--sample-seed -1", {"--sample-seed", "'-1'", "18446744073709551615"});
  expect_usage_error("--sample-seed 18446744073709551616", {"--sample-seed", "18446744073709551616"});
  expect_usage_error("--sample-seed 0x10", {"--sample-seed", "0x10", "decimal"});
  expect_usage_error("--temperature 0x1p-2", {"--temperature", "0x1p-2", "decimal"});
  expect_usage_error("--lr 1e999", {"--lr", "1e999", "finite"});
  expect_usage_error("--clip inf", {"--clip", "inf"});
  expect_usage_error("--comm-timeout 0x10", {"--comm-timeout", "0x10", "decimal"});
  expect_usage_error("--inject-fault 0x1:1", {"--inject-fault", "0x1:1"});
  EXPECT_EQ(run_command(dp() + " --steps 0 --sample-seed 18446744073709551615 --temperature 2.5e-1").exit_code, 0);
  const char* estimate = std::getenv("ZF_MEMORY_ESTIMATE_BIN");
  const std::string tool = estimate ? estimate : "build/tools/memory_estimate";
  for (const char* args : {"--params 0x10", "--model tiny --ranks 0x2", "--model tiny --batch 0x2"}) {
    auto r = run_command(tool + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("0x"), std::string::npos) << r.output;
  }
}

// A --val-data file's own format is named, not the training data's.
TEST(Cli, ValDataErrorsNameItsFormat) {
  const std::string dir = test::temp_dir(), val = dir + "/val.txt";
  std::ofstream(val) << std::string(10, 'a');
  expect_usage_error("--val-every 1 --val-data " + val, {"validation tokens from " + val + " (raw bytes)"});
  std::filesystem::remove_all(dir);
}

// The notes of a resume go to stderr, so that --quiet keeps them.
TEST(Cli, ResumeNotesSurviveQuiet) {
  const std::string dir = test::temp_dir();
  ASSERT_EQ(run_command(dp() + " --save " + dir + "/ck.st").exit_code, 0);
  auto r = run_command("(" + dp() + " --ranks 2 --steps 2 --resume " + dir + "/ck.st >/dev/null)");  // stderr alone
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("note: the checkpoint was trained with global batch 1"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

// Sizes that do not fit in 64-bit byte counts, and fractions of a byte.
TEST(Cli, DeviceMemOutOfRangeOrFractional) {
  expect_usage_error("--device-mem 10000000000000000000", {"--device-mem", "10000000000000000000", "largest"});
  expect_usage_error("--device-mem 99999999999999999999999TiB", {"--device-mem", "largest"});
  expect_usage_error("--device-mem 1.5", {"--device-mem", "1.5", "whole number of bytes"});
  expect_usage_error("--device-mem 1.5B", {"--device-mem", "1.5B", "whole number of bytes"});
}

// More rank threads than 4 per core is refused unless asked for: the cap
// says how to lift it.
TEST(Cli, ManyRanksNeedTheOverride) {
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int n = 4 * cores + 1;
  if (n > 1024) GTEST_SKIP() << cores << " cores: 4 per core is above the hard limit of 1024 ranks";
  expect_usage_error("--ranks " + std::to_string(n), {"--ranks", std::to_string(n), "ZF_OVERSUBSCRIBE=1"});
  expect_usage_error("--ranks 1025", {"--ranks", "1024"});
}

}  // namespace
}  // namespace zf
