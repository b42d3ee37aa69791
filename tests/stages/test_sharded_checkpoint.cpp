// test_sharded_checkpoint.cpp: --save-format sharded (common/io/
// sharded_checkpoint.h), in every stage. What a user relies on:
// - Each rank writes what it holds, and the folder holds the same states as
//   the consolidated file: consolidated by the tool's function it is that
//   file to the byte, and cut again it consolidates to the same bytes.
// - It resumes in any stage at any N as the consolidated file does: bit for
//   bit at the same N, and the same final hash as the consolidated path at
//   another N and stage (resharding on load), --init included.
// - `latest` names the newest committed step; a run removes only its own
//   earlier checkpoints; a save that did not finish is no checkpoint and is
//   cleaned by the next save of that step; a failing rank leaves the
//   previous checkpoint whole.
// - Every damaged or mismatched folder is refused before a step, naming
//   what is wrong.
//
//   meson test -C build checkpoint
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "data_parallel.h"
#include "fsdp.h"
#include "extensions/offload.h"
#include "safetensors.h"
#include "sharded_checkpoint.h"
#include "stages/sharded_test_fixture.h"
#include "stages/stage_test_util.h"
#include "test_util.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

namespace fs = std::filesystem;
using test::expect_has;
using test::quiet_config;
using test::refusal;
using test::tail;

struct Stage {
  const char* name;
  std::function<RunResult(const RunConfig&)> run;  // run_training with the stage's function
  std::function<void(RunConfig&)> flags;
};

std::vector<Stage> stages(const std::string& dir) {
  using test::run_of;
  return {{"dp", run_of(train_data_parallel), [](RunConfig&) {}},
          {"zero1", run_of(train_zero1), [](RunConfig&) {}},
          {"zero2", run_of(train_zero2), [](RunConfig&) {}},
          {"zero3", run_of(train_zero3), [](RunConfig&) {}},
          {"fsdp", run_of(train_fsdp), [](RunConfig& c) { c.fsdp.wrap_blocks = 2; }},  // units of two blocks
          {"offload", run_of(train_offload_extended), [dir](RunConfig& c) {
             fs::create_directories(dir + "/tier");
             c.offload.offload_dir = dir + "/tier";  // the moments in files
           }}};
}

// Every stage, N = 3 (tiny pads there), both recipes in turn: the sharded
// folder of step 3 consolidates to the bytes of the consolidated save; it
// resumes bit for bit at N = 3 and, in ZeRO-1 at N = 2, ends on the hash the
// consolidated file gives there.
TEST_F(ShardedCheckpoint, EveryStageWritesWhatTheConsolidatedFileHolds) {
  int i = 0;
  for (const Stage& st : stages(dir_)) {
    SCOPED_TRACE(st.name);
    RunConfig cfg = quiet_config("tiny", 3, 2, 6);
    cfg.precision = i++ % 2 ? Precision::bf16 : Precision::fp32;
    cfg.stage = st.name;
    st.flags(cfg);
    const RunResult whole = st.run(cfg);

    RunConfig first = cfg;
    first.steps = 3;
    first.save = path(std::string(st.name) + ".safetensors");
    st.run(first);
    first.save = path(st.name);
    first.save_sharded = true;
    st.run(first);
    EXPECT_EQ(entries(first.save), (std::vector<std::string>{"latest", "lock", "step-00000003"}));
    EXPECT_EQ(entries(first.save + "/step-00000003"),
              (std::vector<std::string>{"index.json", "rank-00000-of-00003.safetensors",
                                        "rank-00001-of-00003.safetensors", "rank-00002-of-00003.safetensors"}));
    const std::string consolidated = path(std::string(st.name) + ".consolidated");
    consolidate_checkpoint(first.save, consolidated, 1000);
    EXPECT_EQ(bytes_of(consolidated), bytes_of(first.save + ".safetensors")) << "consolidated differs";

    RunConfig resume = cfg;
    resume.resume = first.save;
    resume.save.clear();
    const RunResult resumed = st.run(resume);
    EXPECT_EQ(resumed.ranks[0].losses, tail(whole, 3));
    for (const auto& rank : resumed.ranks) EXPECT_EQ(rank.param_hash, whole.ranks[0].param_hash);

    RunConfig other = resume;
    other.ranks = 2;
    other.batch = 3;  // the same global batch
    other.stage = "zero1";
    other.offload.offload_dir.clear();
    const RunResult from_folder = run_training(other, train_zero1);
    other.resume = first.save + ".safetensors";
    const RunResult from_file = run_training(other, train_zero1);
    EXPECT_EQ(from_folder.ranks[0].losses, from_file.ranks[0].losses);
    EXPECT_EQ(from_folder.ranks[0].param_hash, from_file.ranks[0].param_hash);
  }
}

// Resharding the other way: a folder written by ZeRO-1 at N = 2 read by
// every stage at N = 4 (FSDP's flat units of two blocks cut elsewhere than
// ZeRO-1's units): each ends on the consolidated file's hash.
TEST_F(ShardedCheckpoint, EveryStageResumesFromAnotherStagesFolder) {
  RunConfig cfg = quiet_config("tiny", 2, 2, 3);
  cfg.save = path("ck");
  cfg.save_sharded = true;
  run_training(cfg, train_zero1);
  cfg.save = path("ck.safetensors");
  cfg.save_sharded = false;
  cfg.log_json = path("log.jsonl");
  run_training(cfg, train_zero1);
  {  // a save the steps wait for says so: its two times are one
    std::ifstream in(cfg.log_json);
    int saves = 0;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("save")) continue;
      EXPECT_EQ(j["save"]["ms"], j["save"]["write_ms"]) << line;
      saves++;
    }
    EXPECT_EQ(saves, 1);
  }
  for (const Stage& st : stages(dir_)) {
    SCOPED_TRACE(st.name);
    RunConfig resume = quiet_config("tiny", 4, 1, 5);
    st.flags(resume);
    resume.resume = path("ck");
    const RunResult a = st.run(resume);
    resume.resume = path("ck.safetensors");
    const RunResult b = st.run(resume);
    EXPECT_EQ(a.ranks[0].losses, b.ranks[0].losses);
    EXPECT_EQ(a.ranks[0].param_hash, b.ranks[0].param_hash);
  }
}

// The tool's two directions: cut into 5 files (none of which any run
// writes) and consolidated again, the bytes are the file's; the cut folder
// resumes as the file does; --init reads a folder's parameters, and samples
// from them what it samples from the file.
TEST_F(ShardedCheckpoint, ShardAndConsolidateAreInverse) {
  RunConfig cfg = quiet_config("tiny", 3, 2, 3);
  cfg.precision = Precision::bf16;
  cfg.save = path("ck.safetensors");
  run_training(cfg, train_zero2);
  shard_checkpoint(cfg.save, path("cut"), 5);
  EXPECT_EQ(entries(path("cut/step-00000003")).size(), 6u);
  consolidate_checkpoint(path("cut"), path("again.safetensors"), 77);
  EXPECT_EQ(bytes_of(path("again.safetensors")), bytes_of(cfg.save));

  RunConfig resume = quiet_config("tiny", 2, 3, 5);
  resume.resume = path("cut");
  const RunResult a = run_training(resume, train_zero3);
  resume.resume = cfg.save;
  const RunResult b = run_training(resume, train_zero3);
  EXPECT_EQ(a.ranks[0].param_hash, b.ranks[0].param_hash);

  RunConfig init = quiet_config("tiny", 2, 2, 2);
  init.init = path("cut/step-00000003");  // a step folder, named directly
  init.sample_every = 1;                  // and text from it, as from the file
  init.sample.length = 12;
  const RunResult c = run_training(init, train_fsdp);
  init.init = cfg.save;
  const RunResult d = run_training(init, train_fsdp);
  EXPECT_EQ(c.ranks[0].param_hash, d.ranks[0].param_hash);
  ASSERT_FALSE(c.ranks[0].samples.empty());
  EXPECT_EQ(c.ranks[0].samples, d.ranks[0].samples);

  // The file to cut, inside the unfinished step folder the cut would empty: refused, the file kept.
  fs::create_directories(path("other/step-00000003"));
  const std::string inside = path("other/step-00000003/rank-00000-of-00001.safetensors");
  fs::copy_file(cfg.save, inside);
  expect_has(refusal([&] { shard_checkpoint(inside, path("other"), 1); }), {inside, "lies in", "move it out"});
  // A file, or a link to nothing, where the folder should be.
  { std::ofstream(path("file.txt")) << "mine"; }
  fs::create_symlink("nowhere", path("dangling"));
  expect_has(refusal([&] { shard_checkpoint(cfg.save, path("file.txt"), 2); }), {"is a regular file, not a folder"});
  expect_has(refusal([&] { shard_checkpoint(cfg.save, path("dangling"), 2); }), {"is a link to nothing"});
  EXPECT_EQ(bytes_of(path("file.txt")), "mine");
  EXPECT_FALSE(fs::exists(path("nowhere")));
  // A step folder is no folder of saves, for the tool as for a run.
  expect_has(refusal([&] { shard_checkpoint(cfg.save, path("cut/step-00000003"), 2); }),
             {"the folder " + path("cut/step-00000003"), "is the step folder of a checkpoint"});
  const RunConfig into = saving_sharded(path("cut/step-00000003"));
  expect_has(refusal([&] { run_training(into, train_zero3); }), {"--save " + into.save, "step folder"});
  expect_has(refusal([&] { shard_checkpoint(cfg.save, path("cut/step-00000003/sub"), 2); }),
             {"lies in the step folder of a checkpoint"});
  EXPECT_FALSE(fs::exists(path("cut/step-00000003/sub")));
  EXPECT_EQ(bytes_of(inside), bytes_of(cfg.save));
}

// Consolidating streams: the small model's 10 MiB checkpoint passes through
// a 256 KiB buffer, and the process grows by less than a quarter of the
// file, where reading the states whole (the control, to show that the
// measure sees it) grows it by more than half.
// The buffer held is what was asked for, or the largest tensor when smaller.
// A model given as a shape (--model L=...,C=...) is named by its shape in
// the checkpoint, which the tool reads back: cut and consolidated, the
// bytes are the file's, and the cut folder resumes as the file does.
TEST_F(ShardedCheckpoint, AShapedModelIsCutAndConsolidatedByItsShape) {
  RunConfig cfg = quiet_config("tiny,L=3,T=32", 2, 2, 2);
  ASSERT_EQ(cfg.model.name, "L=3,C=64,H=4,T=32,V=256");
  cfg.save = path("shaped.safetensors");
  run_training(cfg, train_data_parallel);
  shard_checkpoint(cfg.save, path("shaped"), 3);
  consolidate_checkpoint(path("shaped"), path("shaped.again"), 100);
  EXPECT_EQ(bytes_of(path("shaped.again")), bytes_of(cfg.save));
  RunConfig resume = quiet_config("L=3,C=64,H=4,T=32,V=256", 2, 2, 3);
  resume.resume = path("shaped");
  const RunResult a = run_training(resume, train_fsdp);
  resume.resume = cfg.save;
  EXPECT_EQ(a.ranks[0].param_hash, run_training(resume, train_fsdp).ranks[0].param_hash);
}

TEST_F(ShardedCheckpoint, ConsolidationHoldsOnlyItsBuffer) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory hides what the process itself holds";
#endif
  RunConfig cfg = quiet_config("small", 2, 1, 1);
  cfg.save = path("ck");
  cfg.save_sharded = true;
  run_training(cfg, train_zero3);
  RunConfig tiny = quiet_config("tiny", 2, 1, 1);
  tiny.save = path("tiny");
  tiny.save_sharded = true;
  run_training(tiny, train_zero3);
  const ModelLayout layout = build_layout(cfg.model);
  // Each child first consolidates the tiny model's checkpoint, so that the
  // code, the libraries' pages and the allocator's arenas are resident in
  // all three alike; then what differs is what the small model's data adds.
  auto warm = [&] { consolidate_checkpoint(path("tiny"), path("warm.safetensors." + std::to_string(::getpid())), 1 << 16); };
  const long idle = test::child_peak(warm);
  const long streamed = test::child_peak([&] {
    warm();
    if (consolidate_checkpoint(path("ck"), path("a.safetensors"), 1 << 16) != (1 << 16) * sizeof(float)) ::_exit(2);
  }) - idle;
  const long whole = test::child_peak([&] {
    warm();
    const ShardedCheckpointReader reader(path("ck"), layout);
    std::vector<std::vector<float>> all(3, std::vector<float>(layout.numel));
    for (StateKind kind : kStateKinds) reader.read_all(kind, all[size_t(kind)].data());
  }) - idle;
  const auto file = long(fs::file_size(path("a.safetensors")));
  if (test::print_measures())
    std::printf("a %ld-byte checkpoint: consolidating added %ld resident bytes, reading it whole %ld\n", file,
                streamed, whole);
  EXPECT_GT(whole, file / 2) << "the measure does not see a process that reads the checkpoint whole";
  EXPECT_LT(streamed, file / 4) << "consolidating held more than its buffer";
  size_t largest = 0;
  for (const auto& u : layout.units)
    for (const auto& p : u.params) largest = std::max(largest, p.numel);
  EXPECT_EQ(consolidate_checkpoint(path("ck"), path("b.safetensors"), size_t(1) << 30), largest * sizeof(float));
  EXPECT_EQ(bytes_of(path("a.safetensors")), bytes_of(path("b.safetensors")));
}

// --save-every 2 over 6 steps: `latest` moves to each new step and the run
// removes the checkpoints it wrote before; a checkpoint that was there
// before the run (the one it resumed from) stays.
TEST_F(ShardedCheckpoint, LatestMovesAndOnlyTheRunsOwnEarlierCheckpointsGo) {
  RunConfig cfg = saving_sharded(path("ck"));
  run_training(cfg, train_zero3);
  RunConfig more = cfg;
  more.steps = 6;
  more.save_every = 2;
  more.resume = path("ck");
  run_training(more, train_zero3);
  EXPECT_EQ(entries(path("ck")), (std::vector<std::string>{"latest", "lock", "step-00000002", "step-00000006"}));
  EXPECT_EQ(bytes_of(path("ck/latest")), "step-00000006\n");
  EXPECT_EQ(ShardedCheckpointReader(path("ck"), build_layout(cfg.model)).step(), 6);
}

// A rank fails in step 5 of 6 with --save-every 2: the folder's latest is
// step 4, whole, and resuming from it finishes the run as if nothing had
// happened. A step folder left without its index (a save killed before it
// committed) is no checkpoint, and the next save of that step empties it.
TEST_F(ShardedCheckpoint, AFailureLeavesThePreviousCheckpointWhole) {
  RunConfig cfg = test::with_schedule(quiet_config("tiny", 2, 2, 6));
  const RunResult whole = run_training(cfg, train_fsdp);
  RunConfig failing = cfg;
  failing.save = path("ck");
  failing.save_sharded = true;
  failing.save_every = 2;
  failing.fault_rank = 1;
  failing.fault_step = 5;
  EXPECT_THROW(run_training(failing, train_fsdp), Error);
  EXPECT_EQ(ShardedCheckpointReader(path("ck"), build_layout(cfg.model)).step(), 4);

  // As a kill in the middle of step 6's save would leave it: a rank's file, no index.
  fs::create_directory(path("ck/step-00000006"));
  fs::copy_file(path("ck/step-00000004/rank-00000-of-00002.safetensors"),
                path("ck/step-00000006/rank-00000-of-00002.safetensors"));
  expect_has(refusal([&] { ShardedCheckpointReader(path("ck/step-00000006"), build_layout(cfg.model)); }),
             {"step-00000006", "a save that did not finish"});
  RunConfig resume = cfg;
  resume.resume = path("ck");
  resume.save = path("ck");
  resume.save_sharded = true;
  const RunResult rest = run_training(resume, train_fsdp);
  EXPECT_EQ(rest.ranks[0].losses, tail(whole, 4));
  EXPECT_EQ(rest.ranks[0].param_hash, whole.ranks[0].param_hash);
  EXPECT_EQ(ShardedCheckpointReader(path("ck"), build_layout(cfg.model)).step(), 6);
}

// --save-async: the states of each save are copied and written while the
// next steps train, and the checkpoint is the synchronous save's, to the
// byte; the run's losses and hash do not change.
TEST_F(ShardedCheckpoint, AsyncSavesWriteTheSameCheckpoint) {
  for (const Stage& st : stages(dir_)) {
    SCOPED_TRACE(st.name);
    RunConfig cfg = quiet_config("tiny", 2, 2, 7);
    cfg.stage = st.name;
    st.flags(cfg);
    cfg.save_sharded = true;
    cfg.save_every = 3;
    cfg.save = path(std::string(st.name) + "_sync");
    const RunResult sync = st.run(cfg);
    cfg.save = path(std::string(st.name) + "_async");
    cfg.save_async = true;
    const RunResult async = st.run(cfg);
    EXPECT_EQ(async.ranks[0].losses, sync.ranks[0].losses);
    EXPECT_EQ(async.ranks[0].param_hash, sync.ranks[0].param_hash);
    EXPECT_EQ(entries(cfg.save), (std::vector<std::string>{"latest", "lock", "step-00000007"}));
    for (const char* kind : {"_sync", "_async"})
      consolidate_checkpoint(path(std::string(st.name) + kind), path(std::string(st.name) + kind + ".st"), 1000);
    EXPECT_EQ(bytes_of(path(std::string(st.name) + "_async.st")), bytes_of(path(std::string(st.name) + "_sync.st")));
  }
}

// A rank fails in the step after the save of step 4 began (step index 4),
// while that save is written in the background: it is never committed (no
// vote said every rank's file was on disk), so `latest` stays on step 2,
// which resumes as if nothing had happened.
TEST_F(ShardedCheckpoint, AFailureDuringAnAsyncSaveLeavesThePreviousOne) {
  RunConfig cfg = quiet_config("tiny", 2, 2, 6);
  const RunResult whole = run_training(cfg, train_zero3);
  RunConfig failing = cfg;
  failing.save = path("ck");
  failing.save_sharded = failing.save_async = true;
  failing.save_every = 2;
  failing.fault_rank = 1;  // rank 0 may have written its file: it still must not commit
  failing.fault_step = 4;
  EXPECT_THROW(run_training(failing, train_zero3), Error);
  EXPECT_EQ(bytes_of(path("ck/latest")), "step-00000002\n");
  RunConfig resume = cfg;
  resume.resume = path("ck");
  const RunResult rest = run_training(resume, train_zero3);
  EXPECT_EQ(rest.ranks[0].losses, tail(whole, 2));
  EXPECT_EQ(rest.ranks[0].param_hash, whole.ranks[0].param_hash);
}

// Hybrid sharding: one shard group writes (F files, not N); stage 05 with
// the moments on disk reads them from its files.
TEST_F(ShardedCheckpoint, OneShardGroupWritesUnderHybridSharding) {
  RunConfig cfg = quiet_config("tiny", 4, 1, 2);
  cfg.fsdp.shard_group = 2;
  cfg.save = path("ck");
  cfg.save_sharded = true;
  run_training(cfg, train_fsdp);
  EXPECT_EQ(entries(path("ck/step-00000002")),
            (std::vector<std::string>{"index.json", "rank-00000-of-00002.safetensors",
                                      "rank-00001-of-00002.safetensors"}));
  RunConfig plain = cfg;
  plain.save = path("ck.safetensors");
  plain.save_sharded = false;
  run_training(plain, train_fsdp);
  consolidate_checkpoint(path("ck"), path("c.safetensors"), 1000);
  EXPECT_EQ(bytes_of(path("c.safetensors")), bytes_of(plain.save));
}

// --save with --save-format sharded is refused before step 0 when it is a
// file, or holds a checkpoint after the run's first step; the step folder of
// a save that did not finish keeps what no save writes.
TEST_F(ShardedCheckpoint, SaveFolderRefusals) {
  RunConfig cfg = quiet_config("tiny", 2, 2, 2);
  cfg.save_sharded = true;
  { std::ofstream(path("file")) << "mine"; }
  cfg.save = path("file");
  expect_has(refusal([&] { run_training(cfg, train_zero3); }), {"--save", "writes a folder"});
  EXPECT_EQ(bytes_of(path("file")), "mine");

  cfg.save = path("ck");
  run_training(cfg, train_zero3);
  expect_has(refusal([&] { run_training(cfg, train_zero3); }),
             {"--save", "already holds the checkpoint of step 2", "first step 0"});

  RunConfig other = cfg;
  other.save = path("other");
  fs::create_directories(path("other/step-00000002"));
  { std::ofstream(path("other/step-00000002/notes.txt")) << "mine"; }
  try {
    run_training(other, train_zero3);
    ADD_FAILURE() << "the save went ahead";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("notes.txt, which no save writes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(bytes_of(path("other/step-00000002/notes.txt")), "mine");
}

// Each way a folder can be damaged or mismatched, refused by name.
TEST_F(ShardedCheckpoint, DamagedFoldersAreRefused) {
  RunConfig cfg = quiet_config("tiny", 2, 2, 1);
  cfg.save = path("ck");
  cfg.save_sharded = true;
  run_training(cfg, train_zero3);
  const ModelLayout layout = build_layout(cfg.model);
  const std::string step = path("ck/step-00000001"), index = step + "/index.json";
  const std::string good_index = bytes_of(index);
  const std::string file0 = step + "/rank-00000-of-00002.safetensors";
  const std::string good0 = bytes_of(file0);
  auto put = [](const std::string& file, const std::string& text) { std::ofstream(file, std::ios::binary) << text; };
  auto refused = [&](std::initializer_list<std::string> words) {
    expect_has(refusal([&] { ShardedCheckpointReader(path("ck"), layout); }), words);
  };
  auto edit_index = [&](const std::string& from, const std::string& to) {
    std::string text = good_index;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    put(index, text.replace(at, from.size(), to));
  };
  EXPECT_NO_THROW(ShardedCheckpointReader(path("ck"), layout));

  put(path("ck/latest"), "../elsewhere\n");
  refused({"latest", "not the name of a step folder"});
  put(path("ck/latest"), "step-00000009\n");
  refused({"step-00000009", "holds no index.json"});
  put(path("ck/latest"), "step-00000001\n");

  put(index, good_index.substr(0, good_index.size() / 2));
  refused({"index.json", "is not JSON"});
  edit_index("\"step\": 1", "\"step\": 2");
  refused({"rank-00000-of-00002.safetensors", "says step '1' where its index says '2'", "another save"});
  edit_index("\"offset\":0,\"numel\":", "\"offset\":1,\"numel\":");
  refused({"leaving a gap"});
  {  // the first tensor's second piece starting one element inside its first
    const std::string first = "\"offset\":0,\"numel\":";
    const size_t at = good_index.find(first) + first.size();
    const size_t numel = std::stoul(good_index.substr(at));
    ASSERT_GT(numel, 1u);
    const std::string second = "\"offset\":" + std::to_string(numel) + ",";
    ASSERT_NE(good_index.find(second, at), std::string::npos) << "two pieces (2 ranks)";
    edit_index(second, "\"offset\":" + std::to_string(numel - 1) + ",");
    refused({"overlapping at element " + std::to_string(numel - 1)});
  }
  edit_index("\"step\": 1,", "\"step\": 1,\n \"step\": 1,");
  refused({"gives the key \"step\" twice in the index"});
  edit_index("\"seed\":\"1337\"", "\"seed\":\"1337\",\"seed\":\"7\"");
  refused({"gives the key \"seed\" twice in \"metadata\""});
  edit_index("\"name\":\"wte.weight\"", "\"name\":\"wte.weights\"");
  refused({"does not hold", "'wte.weights' its index says it does"});
  edit_index("\"model\":\"tiny\"", "\"model\":\"small\"");
  refused({"'model' = 'small'"});
  edit_index("\"format\": \"zero-to-fsdp sharded checkpoint\"", "\"format\": \"something\"");
  refused({"was not written by --save"});
  put(index, good_index);

  // A flipped bit in a rank's data, and a NaN written with a good checksum.
  std::string bad = good0;
  bad[bad.size() - 3] ^= 0x10;
  put(file0, bad);
  refused({file0, "checksum"});
  {
    SafetensorsReader r(step + "/rank-00001-of-00002.safetensors");
    std::vector<TensorRef> refs;
    std::vector<std::vector<float>> values;
    std::map<std::string, std::string> meta = r.metadata();
    for (const TensorInfo& t : r.tensors()) {
      values.emplace_back(t.numel());
      r.read(t.name, t.shape, DType::f32, values.back().data());
    }
    values[0][3] = std::nanf("");
    for (size_t i = 0; i < r.tensors().size(); ++i)
      refs.push_back({r.tensors()[i].name, DType::f32, r.tensors()[i].shape, values[i].data()});
    put(file0, good0);
    write_safetensors(step + "/rank-00001-of-00002.safetensors", refs, meta);
  }
  refused({"rank-00001-of-00002.safetensors", "holds nan"});

  put(index, good_index);
  edit_index("\"dtype\":\"F32\"", "\"dtype\":\"F16\"");
  refused({"index.json", "dtype 'F16'", "damaged"});
}

}  // namespace
}  // namespace zf
