// stop_request.cpp: the stop signals' handlers and the flag they set.
#include "stop_request.h"

#include <atomic>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <iterator>
#include <unistd.h>

namespace zf {

namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_at_boundaries{false};  // stop_at_step_boundaries() was called
// What the handler writes, prepared outside it: a handler may call only
// async-signal-safe functions (write, _exit), so no formatting there.
char g_first_msg[512];
char g_first_killed_msg[768];  // SIGINT, SIGTERM: with the launcher's note, if any
char g_second_msg[256];
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
char g_early_msg[std::size(kStopSignals)][512];  // before the states are loaded, by signal
size_t g_first_len = 0, g_first_killed_len = 0, g_second_len = 0, g_early_len[std::size(kStopSignals)] = {};

// remove_on_stop's slots: filled and emptied by the ranks, read by the
// handler, so each is published by its atomic state (free, being written,
// ready) and holds only plain data.
struct Removal {
  std::atomic<int> state{0};
  int dir = -1;
  bool folder = false;
  char name[256] = {};
};
constexpr int kFree = 0, kWriting = 1, kReady = 2;
Removal g_removals[256];

void remove_registered() {
  for (bool folders : {false, true})
    for (Removal& r : g_removals)
      if (r.state.load() == kReady && r.folder == folders) ::unlinkat(r.dir, r.name, folders ? AT_REMOVEDIR : 0);
}

void on_stop_signal(int sig) {
  int none = 0;
  const bool first = g_signal.compare_exchange_strong(none, sig);
  if (first && g_at_boundaries.load()) {
    if (sig == SIGINT || sig == SIGTERM) (void)!::write(STDERR_FILENO, g_first_killed_msg, g_first_killed_len);
    else (void)!::write(STDERR_FILENO, g_first_msg, g_first_len);
    return;
  }
  if (first) {  // nothing is trained yet: say so, and stop now
    for (size_t i = 0; i < std::size(kStopSignals); ++i)
      if (kStopSignals[i] == sig) (void)!::write(STDERR_FILENO, g_early_msg[i], g_early_len[i]);
  } else {
    (void)!::write(STDERR_FILENO, g_second_msg, g_second_len);
  }
  remove_registered();
  ::_exit(128 + sig);
}

}  // namespace

std::string signal_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    default: return "signal " + std::to_string(signal);
  }
}

std::string stopped_before_training(int signal, const std::string& save) {
  return "stopped by " + signal_name(signal) + " before the first step: nothing is trained yet, so nothing is saved" +
         (save.empty() ? std::string() : " (" + save + " is as it was)");
}

void install_stop_handlers(const std::string& program, const std::string& save, bool announce,
                           const std::string& killed_note) {
  const std::string first = "\n" + program + ": stop requested: every rank finishes the step (or the evaluation "
                            "batch, or the sample token) it is in, then the run " +
                            (save.empty() ? std::string("stops (no --save: nothing is saved)")
                                          : "saves " + save + " and stops") +
                            "; a second signal stops at once\n";
  const std::string killed = killed_note.empty() ? first : first + program + ": " + killed_note + "\n";
  const std::string second = program + ": second signal: stopping now, without saving\n";
  g_first_len = announce ? first.copy(g_first_msg, sizeof g_first_msg - 1) : 0;
  for (size_t i = 0; i < std::size(kStopSignals); ++i) {
    const std::string early = "\n" + program + ": " + stopped_before_training(kStopSignals[i], save) + "\n";
    g_early_len[i] = announce ? early.copy(g_early_msg[i], sizeof g_early_msg[i] - 1) : 0;
  }
  g_first_killed_len = announce ? killed.copy(g_first_killed_msg, sizeof g_first_killed_msg - 1) : 0;
  g_second_len = second.copy(g_second_msg, sizeof g_second_msg - 1);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // Restart interrupted system calls (reads, writes, waits), so that the
  // code between two step boundaries never sees EINTR.
  sa.sa_flags = SA_RESTART;
  g_at_boundaries.store(false);
  for (int s : kStopSignals) ::sigaction(s, &sa, nullptr);
}

void stop_at_step_boundaries() { g_at_boundaries.store(true); }

int remove_on_stop(int dir, const std::string& name, bool folder) {
  if (name.size() >= sizeof g_removals[0].name) return -1;
  for (int i = 0; i < int(std::size(g_removals)); ++i) {
    Removal& r = g_removals[i];
    int free = kFree;
    if (!r.state.compare_exchange_strong(free, kWriting)) continue;
    r.dir = dir;
    r.folder = folder;
    std::memcpy(r.name, name.c_str(), name.size() + 1);
    r.state.store(kReady);
    return i;
  }
  return -1;
}

void forget_on_stop(int handle) {
  if (handle >= 0 && handle < int(std::size(g_removals))) g_removals[handle].state.store(kFree);
}

int stop_signal_received() { return g_signal.load(); }

void set_stop_signal(int signal) { g_signal.store(signal); }

}  // namespace zf
