// stop_request.cpp: the stop signals' handlers and the flag they set.
#include "stop_request.h"

#include <atomic>
#include <csignal>
#include <cstring>
#include <unistd.h>

namespace zf {

namespace {

std::atomic<int> g_signal{0};
// What the handler writes, prepared outside it: a handler may call only
// async-signal-safe functions (write, _exit), so no formatting there.
char g_first_msg[256];
char g_second_msg[256];
size_t g_first_len = 0, g_second_len = 0;
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

void on_stop_signal(int sig) {
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) {
    (void)!::write(STDERR_FILENO, g_first_msg, g_first_len);
    return;
  }
  (void)!::write(STDERR_FILENO, g_second_msg, g_second_len);
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

void install_stop_handlers(const std::string& program, const std::string& save) {
  const std::string first = "\n" + program + ": stop requested: every rank finishes its step, then the run " +
                            (save.empty() ? std::string("stops (no --save: nothing is saved)")
                                          : "saves " + save + " and stops") +
                            "; a second signal stops at once\n";
  const std::string second = program + ": second signal: stopping now, without saving\n";
  g_first_len = first.copy(g_first_msg, sizeof g_first_msg - 1);
  g_second_len = second.copy(g_second_msg, sizeof g_second_msg - 1);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // Restart interrupted system calls (reads, writes, waits), so that the
  // code between two step boundaries never sees EINTR.
  sa.sa_flags = SA_RESTART;
  for (int s : kStopSignals) ::sigaction(s, &sa, nullptr);
}

int stop_signal_received() { return g_signal.load(); }

void set_stop_signal(int signal) { g_signal.store(signal); }

}  // namespace zf
