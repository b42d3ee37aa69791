// test_rendezvous.cpp: the file rendezvous that hands NCCL's id from rank 0 to
// the other processes of a run started without MPI (common/comm/rendezvous.h).
// Nothing here needs a GPU: the payload is any bytes.
//
//   build/tests/test_launch --gtest_filter='Rendezvous*'
//
// What it promises: every reader gets rank 0's bytes, whoever starts first;
// a file left by an earlier run is never taken, however recent; a missing or
// stale file times out with a message naming the file and what to check; a
// foreign file or another world size is a usage error; rank 0 removes the
// file when done, and refuses a path another live run is using.
//
// Timing: rank 0 touches its file every RendezvousPublisher::kRefreshMs
// (100 ms). The waits below are a few of those, or at least 50 ms where a
// file must be older than a reader's start on the file system's clock (its
// timestamps are coarse: a few ms on tmpfs and ext4).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "rendezvous.h"
#include "test_util.h"

namespace {

using zf::RendezvousPublisher;
using zf::rendezvous_read;
using Clock = std::chrono::steady_clock;

class Rendezvous : public zf::test::TempDirTest {};

void write_file(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void pause_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// A file as an earlier run of world 2 would have left it, then aged 50 ms.
void leave_stale_file(const std::string& path, const std::string& payload) {
  write_file(path, "zf-rendezvous v1 world=2 bytes=" + std::to_string(payload.size()) + "\n" + payload);
  pause_ms(50);
}

// Readers started before rank 0 all get its bytes (binary, with a NUL and a
// newline, as an NCCL id may have); rank 0 removes the file afterwards.
TEST_F(Rendezvous, EveryReaderGetsRankZerosBytes) {
  const std::string file = path("id");
  const std::string payload = std::string("id\0with\nbytes", 13) + std::string(115, '\x7f');
  const int N = 5;
  std::vector<std::string> got(N), errors(N);
  std::vector<std::thread> readers;
  for (int r = 1; r < N; r++)
    readers.emplace_back([&, r] {
      try {
        got[size_t(r)] = rendezvous_read(file, r, N, 20);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  pause_ms(150);  // the readers are waiting
  {
    RendezvousPublisher rank0(file, payload, N);
    for (auto& t : readers) t.join();
    EXPECT_TRUE(exists(file));
  }
  EXPECT_FALSE(exists(file)) << "rank 0 left its rendezvous file behind";
  for (int r = 1; r < N; r++) {
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(got[size_t(r)], payload) << "rank " << r;
  }
}

// A reader that starts after rank 0 published gets it too (at rank 0's next
// touch of the file).
TEST_F(Rendezvous, ReaderStartingLateGetsIt) {
  const std::string file = path("id");
  RendezvousPublisher rank0(file, "late", 2);
  pause_ms(250);
  const auto t0 = Clock::now();
  EXPECT_EQ(rendezvous_read(file, 1, 2, 10), "late");
  EXPECT_LT(seconds_since(t0), 2.0);
}

// The case the design is for: a reader starts while an earlier run's file is
// still there (the old id would send it to a rank 0 that is gone). It waits,
// and takes this run's file once rank 0 replaces it.
TEST_F(Rendezvous, FileOfAnEarlierRunIsNotTaken) {
  const std::string file = path("id");
  leave_stale_file(file, "old");
  std::string got, error;
  std::thread reader([&] {
    try {
      got = rendezvous_read(file, 1, 2, 20);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  pause_ms(300);  // the reader has seen the old file many times by now
  {
    RendezvousPublisher rank0(file, "new", 2);
    reader.join();
  }
  EXPECT_EQ(error, "");
  EXPECT_EQ(got, "new");
}

TEST_F(Rendezvous, OnlyAStaleFileTimesOutSayingSo) {
  const std::string file = path("id");
  leave_stale_file(file, "old");
  const auto t0 = Clock::now();
  try {
    rendezvous_read(file, 1, 2, 0.4);
    ADD_FAILURE() << "the file of an earlier run was taken";
  } catch (const zf::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(file), std::string::npos) << what;
    EXPECT_NE(what.find("earlier run"), std::string::npos) << what;
    EXPECT_NE(what.find("Is rank 0 of this run running"), std::string::npos) << what;
  }
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST_F(Rendezvous, MissingFileTimesOutNamingIt) {
  const std::string file = path("never");
  const auto t0 = Clock::now();
  try {
    rendezvous_read(file, 3, 4, 0.3);
    ADD_FAILURE() << "no error without a file";
  } catch (const zf::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 3"), std::string::npos) << what;
    EXPECT_NE(what.find(file), std::string::npos) << what;
    EXPECT_NE(what.find("does not exist"), std::string::npos) << what;
    EXPECT_NE(what.find("ZF_RENDEZVOUS"), std::string::npos) << what;
  }
  const double took = seconds_since(t0);
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 5.0);
}

// A fresh file that is not one of ours (a path shared with something else).
TEST_F(Rendezvous, ForeignFileIsAUsageError) {
  const std::string file = path("id");
  std::string error = "no error";
  std::thread reader([&] {
    try {
      rendezvous_read(file, 1, 2, 10);
    } catch (const zf::UsageError& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = std::string("not a usage error: ") + e.what();
    }
  });
  pause_ms(100);
  write_file(file, "this is not a rendezvous file at all\n");
  reader.join();
  EXPECT_NE(error.find("is not a rendezvous file"), std::string::npos) << error;
}

TEST_F(Rendezvous, AnotherWorldSizeIsAUsageError) {
  const std::string file = path("id");
  RendezvousPublisher rank0(file, "x", 2);
  try {
    rendezvous_read(file, 1, 3, 10);
    ADD_FAILURE() << "a reader of world 3 took the file of a world of 2";
  } catch (const zf::UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("WORLD_SIZE is 3"), std::string::npos) << what;
    EXPECT_NE(what.find("run of 2"), std::string::npos) << what;
  }
}

// Two runs alive on one path would hand each other's ranks the wrong id.
TEST_F(Rendezvous, SecondLiveRankZeroOnThePathIsRefused) {
  const std::string file = path("id");
  RendezvousPublisher first(file, "a", 2);
  try {
    RendezvousPublisher second(file, "b", 2);
    ADD_FAILURE() << "a second rank 0 took over a path in use";
  } catch (const zf::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("in use by another run"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rendezvous_read(file, 1, 2, 10), "a");
}

TEST_F(Rendezvous, FolderThatDoesNotExistIsAUsageError) {
  const std::string file = path("no/such/folder/id");
  EXPECT_THROW(rendezvous_read(file, 1, 2, 1), zf::UsageError);
  try {
    RendezvousPublisher rank0(file, "x", 2);
    ADD_FAILURE() << "rank 0 published into a folder that does not exist";
  } catch (const zf::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}

}  // namespace
