// validation_checks.h: what every stage suite checks of --val-every (the
// held-out loss, TrainingRun::evaluate): that it leaves training alone and
// counts its collectives apart, by the formula.
#pragma once

#include "stages/stage_test_util.h"

namespace zf::test {

// --val-every changes nothing of training (the same losses, norms, final
// parameters and training counters, host<->device copies included, as
// without it); every rank has the same held-out losses, before the first
// step and after steps 2 and 4 of 4; and the evaluations'
// collectives are counted apart: per evaluation, for each of its batches,
// `gathers` all-gathers of the padded model (0 where every rank holds every
// parameter, 1 where each unit is gathered for its forward), and the loss's
// all-reduce once. gathers < 0: not checked (the caller does).
inline void expect_validation_is_apart(const StageFn& fn, int gathers) {
  for (int N : {2, 3})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      TrainConfig cfg = config(model_preset("tiny"), N, 2, 4, p);
      SCOPED_TRACE(describe(cfg));
      const RunResult plain = run_training(cfg, fn);
      cfg.val_every = 2;
      cfg.val_batches = 3;
      const RunResult got = run_training(cfg, fn);
      for (size_t r = 0; r < got.ranks.size(); ++r) {
        EXPECT_EQ(got.ranks[r].losses, plain.ranks[r].losses) << "rank " << r;
        EXPECT_EQ(got.ranks[r].param_hash, plain.ranks[r].param_hash) << "rank " << r;
        EXPECT_EQ(got.ranks[r].comm.bytes, plain.ranks[r].comm.bytes) << "rank " << r;
        EXPECT_EQ(got.ranks[r].comm.calls, plain.ranks[r].comm.calls) << "rank " << r;
        const TransferStats &a = got.ranks[r].transfers, &b = plain.ranks[r].transfers;
        EXPECT_EQ(a.to_device_bytes, b.to_device_bytes) << "rank " << r;
        EXPECT_EQ(a.to_host_bytes, b.to_host_bytes) << "rank " << r;
        EXPECT_EQ(a.to_device_copies + a.to_host_copies, b.to_device_copies + b.to_host_copies) << "rank " << r;
        EXPECT_EQ(got.ranks[r].val_losses, got.ranks[0].val_losses) << "rank " << r;
      }
      const auto& v = got.ranks[0].val_losses;
      ASSERT_EQ(v.size(), 3u);
      EXPECT_EQ(v[0].first, 0);
      EXPECT_EQ(v[1].first, 2);
      EXPECT_EQ(v[2].first, 4);
      EXPECT_LT(v[2].second, v[0].second) << "it learns";
      if (gathers < 0) continue;
      const double f = double(N - 1) / N, e = double(esize(p));
      const CommStats& c = got.ranks[0].val_comm;
      // Counted as differences of the run's totals: exact up to their rounding.
      const double tol = 1e-12 * (got.ranks[0].comm.total_bytes() + c.total_bytes());
      EXPECT_NEAR(c.bytes[int(CollectiveKind::all_gather)],
                  3 * 3 * gathers * f * e * double(sizes_of(cfg.model, N).padded), tol) << "all-gathers";
      EXPECT_NEAR(c.bytes[int(CollectiveKind::all_reduce)], 3 * 2 * f * 4, tol) << "the loss's all-reduce";
      EXPECT_NEAR(c.total_bytes(), c.bytes[int(CollectiveKind::all_gather)] + c.bytes[int(CollectiveKind::all_reduce)],
                  tol) << "nothing else";
    }
}

}  // namespace zf::test
