// delayed_update.cpp: one worker thread per update, joined by finish().
#include "delayed_update.h"

#include <utility>

#include "check.h"
#include "training.h"

namespace zf::extensions {

DelayedUpdate::~DelayedUpdate() {
  if (worker_.joinable()) worker_.join();  // its error, if any, is lost with the failing run
}

void DelayedUpdate::launch(std::function<void()> update) {
  REQUIRE(!worker_.joinable() && !result_, "a delayed update is launched before the previous one was taken");
  error_ = nullptr;
  if (clock_) update = clock_->fork(std::move(update));
  worker_ = std::thread([this, update = std::move(update)] {
    Timer t;
    try {
      update();
    } catch (...) {
      error_ = std::current_exception();
    }
    ms_ = t.ms();
  });
  result_ = true;
}

void DelayedUpdate::finish() {
  if (worker_.joinable()) {
    worker_.join();  // the join orders the worker's writes before what follows
    if (clock_) clock_->join();
  }
  if (error_) {
    result_ = false;
    std::rethrow_exception(std::exchange(error_, nullptr));
  }
}

bool DelayedUpdate::take(double* ms) {
  finish();
  if (!result_) return false;
  result_ = false;
  if (ms) *ms = ms_;
  return true;
}

}  // namespace zf::extensions
