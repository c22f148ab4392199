#pragma once
// A deterministic fault hook for the crash tests of the files the workbench writes.
//
// Every durable step of the library's file writers calls fault::write_point(): a temporary file complete (before its
// rename), the rename done (core/atomic_file.h), a record appended (train/metrics.h), a file cut back on resume. With
// ASC_FAULT_DIE_AT=N in the environment, the N-th call of the process kills it with SIGKILL — exactly what `kill -9`
// at that moment does — so that a test can stop a run at every write in turn (N = 1, 2, ... until a run finishes
// before its N-th write) and check what `--resume` makes of the files left behind (tests/crash_test.py). With
// ASC_FAULT_TORN=1 as well, a point that appends a record first writes half of it (a write cut short).
//
//   asc::fault::write_point();                              // after a whole record or file
//   asc::fault::write_point([&] { f.write(rec.data(), rec.size() / 2); f.flush(); });   // before an append
//
// Without ASC_FAULT_DIE_AT a call only counts (one relaxed increment): the hook stays in release builds, so that the
// binaries a user runs are the ones tested.
#include <cstdint>
#include <functional>

namespace asc::fault {

// One write point. When this is the point the environment names, `tear` runs (only with ASC_FAULT_TORN=1; it may
// write part of a record) and the process dies by SIGKILL.
void write_point(const std::function<void()>& tear = {});

// The write points this process has passed.
int64_t write_points();

// A step of a training job ended (train/trainer.h). With ASC_FAULT_KILL_STEP=S (and ASC_FAULT_KILL_RANK=R, default 0)
// in the environment, the process of rank R dies by SIGKILL when step S ends: a rank of an mpirun job lost mid-run, for
// the test of what the job and its last checkpoint make of it.
void step_point(int rank, int64_t step);

}  // namespace asc::fault
