"""The kernel library's own thread pool, emitted as LLVM IR into every kernel library (no libgomp): into
the kernels' module, or as a module of its own that a build compiles once and links next to each
candidate's kernel module (its optimization and code generation took 27 ms of each int8 conv candidate).

libgomp's fork-join waits at its barrier for every thread of the team, so a worker that another process
has descheduled holds the whole region up; two 2-thread packages side by side on 2 cores ran 19x slower
each. This pool waits for no thread that has not joined the region:

- A region is published as a job word `generation << 32 | closed << 31 | joined`. The caller is
  participant 0; a worker joins by raising `joined` with a compare-and-swap while the job is open and
  not full, and gets the next participant number. Chunks are claimed dynamically inside the region (see
  `StmtGen._claim_chunks`), so whatever a late or absent worker would have done, the others do.
- When the caller has run out of chunks it closes the job (no one joins any more) and waits only for
  the workers that joined, which are finishing their last chunk.
- Workers spin for `SPIN_NS` after their last job, then sleep on a futex; the caller pays the wake-up
  system call only when some worker sleeps.
- One region runs at a time per library; a second thread calling in meanwhile runs its region alone.
- A region's team is the calling thread's own (`aotc_set_call_threads`, thread-local) or else the
  library's (`aotc_set_num_threads`), at most `MAX_TEAM`: two models sharing one library, or two calls
  of one model, each set their own team for their call without touching the other's.
- `aotc_bind_threads(cpus, n)` pins participant k to cpus[k mod n] (the tuner's runner binds one
  thread per core, so that two threads never share the core another process left free).
- A forked child starts over without workers; the library's destructor stops and joins its workers, so
  unloading a library (the tuner does it for every candidate) never leaves a thread in unmapped code.

Everything target-specific is in `_ARCH`: the futex system call number, how to pause in a spin loop,
and the width of C's `long`.
"""

from __future__ import annotations

from aotc.codegen.irbuilder import CodegenError, ModuleBuilder

__all__ = ["EXTERNALS", "MAX_TEAM", "PARALLEL", "TEAM_SIZE", "declare_thread_pool", "emit_thread_pool"]

MAX_TEAM = 64
SPIN_NS = 100_000  # a worker's spin before it sleeps: longer than the gaps between a model's kernels
JOIN_SPINS = 1024  # the caller's spins on late chunks before it yields its core between checks

# The region entry and the team size the kernels call: `void (ptr fn, ptr closure, i32 team)`, where
# fn is `void (ptr closure, i32 participant, i32 team)`.
PARALLEL = "@aotc.pool.parallel"
TEAM_SIZE = "@aotc.pool.size"
SHUTDOWN = "@aotc.pool.shutdown"

_ARCH = {
    # arch: (SYS_futex, (spin-wait hint intrinsic, its argument), C long)
    "x86_64": (202, ("llvm.x86.sse2.pause", ""), "i64"),
    "aarch64": (98, ("llvm.aarch64.hint", "i32 1"), "i64"),  # hint #1 is YIELD
    "arm": (240, ("llvm.arm.hint", "i32 1"), "i32"),
}

_GLOBALS = """\
@aotc.pool.job = internal global i64 0, align 64
@aotc.pool.seq = internal global i32 0, align 64
@aotc.pool.sleepers = internal global i32 0, align 64
@aotc.pool.done = internal global i32 0, align 64
@aotc.pool.fn = internal global ptr null, align 64
@aotc.pool.closure = internal global ptr null, align 8
@aotc.pool.team = internal global i32 0, align 8
@aotc.pool.busy = internal global i32 0, align 64
@aotc.pool.threads = internal global i32 0, align 64
@aotc.pool.call_threads = internal thread_local global i32 0, align 4
@aotc.pool.started = internal global i32 0, align 4
@aotc.pool.pid = internal global i32 0, align 4
@aotc.pool.stop = internal global i32 0, align 64
@aotc.pool.handles = internal global [{workers} x {long}] zeroinitializer, align 8
@aotc.pool.cpus = internal global [{team} x i32] zeroinitializer, align 4
@aotc.pool.ncpus = internal global i32 0, align 4
@aotc.pool.born = internal global i32 0, align 4
@aotc.pool.mask = internal global [16 x i64] zeroinitializer, align 8
@aotc.pool.masked = internal global i32 0, align 4
@llvm.global_ctors = appending global [1 x {{ i32, ptr, ptr }}] [{{ i32, ptr, ptr }} {{ i32 65535, ptr @aotc.pool.init, ptr null }}]"""

_DECLS = {
    "syscall": "declare {long} @syscall({long}, ...) nounwind",
    "getpid": "declare i32 @getpid() nounwind",
    "sched_yield": "declare i32 @sched_yield() nounwind",
    "sched_getaffinity": "declare i32 @sched_getaffinity(i32, {long}, ptr) nounwind",
    "sched_setaffinity": "declare i32 @sched_setaffinity(i32, {long}, ptr) nounwind",
    "clock_gettime": "declare i32 @clock_gettime(i32, ptr) nounwind",
    "pthread_create": "declare i32 @pthread_create(ptr, ptr, ptr, ptr) nounwind",
    "pthread_join": "declare i32 @pthread_join({long}, ptr) nounwind",
    "llvm.ctpop.i64": "declare i64 @llvm.ctpop.i64(i64)",
}

# The C library functions the pool calls: a kernel of the same name would take their place at link time
EXTERNALS = frozenset(name for name in _DECLS if not name.startswith("llvm."))

# Mutable locals live in allocas (the optimizer promotes them); every shared word is accessed atomically.
_FUNCTIONS = """\
define internal void @aotc.pool.pause() #0 {{
entry:
  {pause}
  ret void
}}

define internal i64 @aotc.pool.now_ns() #0 {{
entry:
  %ts = alloca [2 x {long}], align 8
  call i32 @clock_gettime(i32 1, ptr %ts)
  %s = load {long}, ptr %ts, align 8
  %p = getelementptr {long}, ptr %ts, i64 1
  %ns = load {long}, ptr %p, align 8
  %s64 = {widen} {long} %s to i64
  %ns64 = {widen} {long} %ns to i64
  %t = mul i64 %s64, 1000000000
  %r = add i64 %t, %ns64
  ret i64 %r
}}

; The cores the loading thread could run on (its affinity mask when the library was loaded), at least 1.
define internal i32 @aotc.pool.default_size() #0 {{
entry:
  %i = alloca i32, align 4
  %sum = alloca i64, align 8
  store i32 0, ptr %i, align 4
  store i64 0, ptr %sum, align 8
  br label %count
count:
  %k = load i32, ptr %i, align 4
  %w = getelementptr i64, ptr @aotc.pool.mask, i32 %k
  %bits = load i64, ptr %w, align 8
  %c = call i64 @llvm.ctpop.i64(i64 %bits)
  %s0 = load i64, ptr %sum, align 8
  %s1 = add i64 %s0, %c
  store i64 %s1, ptr %sum, align 8
  %k1 = add i32 %k, 1
  store i32 %k1, ptr %i, align 4
  %more = icmp slt i32 %k1, 16
  br i1 %more, label %count, label %counted
counted:
  %n = trunc i64 %s1 to i32
  %none = icmp slt i32 %n, 1
  br i1 %none, label %one, label %some
some:
  ret i32 %n
one:
  ret i32 1
}}

; The team of a region this thread starts now: its own override if set, else the library's setting (or
; the default), never more than the pool's largest team.
define {entry} i32 @aotc.pool.size() #0 {{
entry:
  %own = load i32, ptr @aotc.pool.call_threads, align 4
  %has.own = icmp sgt i32 %own, 0
  br i1 %has.own, label %clamp, label %shared
shared:
  %n = load atomic i32, ptr @aotc.pool.threads monotonic, align 4
  %unset = icmp eq i32 %n, 0
  br i1 %unset, label %default, label %clamp
default:
  %d = call i32 @aotc.pool.default_size()
  store atomic i32 %d, ptr @aotc.pool.threads monotonic, align 4
  br label %clamp
clamp:
  %v = phi i32 [ %own, %entry ], [ %n, %shared ], [ %d, %default ]
  %big = icmp sgt i32 %v, {team}
  %r = select i1 %big, i32 {team}, i32 %v
  ret i32 %r
}}

; The library's team for every thread without an override (at least 1; at most the pool's largest team).
define weak_odr void @aotc_set_num_threads(i32 %n) #0 {{
entry:
  %low = icmp slt i32 %n, 1
  %m = select i1 %low, i32 1, i32 %n
  %big = icmp sgt i32 %m, {team}
  %c = select i1 %big, i32 {team}, i32 %m
  store atomic i32 %c, ptr @aotc.pool.threads monotonic, align 4
  ret void
}}

; The calling thread's own team for the regions it starts, over the library's setting; n <= 0 removes it.
define weak_odr void @aotc_set_call_threads(i32 %n) #0 {{
entry:
  %low = icmp slt i32 %n, 0
  %m = select i1 %low, i32 0, i32 %n
  %big = icmp sgt i32 %m, {team}
  %c = select i1 %big, i32 {team}, i32 %m
  store i32 %c, ptr @aotc.pool.call_threads, align 4
  ret void
}}

define weak_odr i32 @aotc_get_max_threads() #0 {{
entry:
  %n = call i32 @aotc.pool.size()
  ret i32 %n
}}

; Participant k runs on cpus[k mod n] (n = 0: on the mask the library was loaded with). The caller is
; participant 0 and moves at once; workers started later move as they start, in start order; workers
; already running stay where they are.
define weak_odr void @aotc_bind_threads(ptr %cpus, i32 %n) #0 {{
entry:
  %i = alloca i32, align 4
  %neg = icmp slt i32 %n, 0
  %n0 = select i1 %neg, i32 0, i32 %n
  %big = icmp sgt i32 %n0, {team}
  %m = select i1 %big, i32 {team}, i32 %n0
  store i32 0, ptr %i, align 4
  br label %copy.check
copy.check:
  %k = load i32, ptr %i, align 4
  %more = icmp slt i32 %k, %m
  br i1 %more, label %copy, label %copied
copy:
  %src = getelementptr i32, ptr %cpus, i32 %k
  %cpu = load i32, ptr %src, align 4
  %dst = getelementptr i32, ptr @aotc.pool.cpus, i32 %k
  store atomic i32 %cpu, ptr %dst monotonic, align 4
  %k1 = add i32 %k, 1
  store i32 %k1, ptr %i, align 4
  br label %copy.check
copied:
  store atomic i32 %m, ptr @aotc.pool.ncpus release, align 4
  call void @aotc.pool.pin(i32 0)
  ret void
}}

define internal void @aotc.pool.pin(i32 %k) #0 {{
entry:
  %mask = alloca [16 x i64], align 8
  %n = load atomic i32, ptr @aotc.pool.ncpus acquire, align 4
  %none = icmp sle i32 %n, 0
  br i1 %none, label %unbound, label %pin
unbound:
  ; back to the mask the library was loaded with (a worker inherits its creator's, maybe a pinned one)
  %masked = load i32, ptr @aotc.pool.masked, align 4
  %known = icmp ne i32 %masked, 0
  br i1 %known, label %restore, label %done
restore:
  call i32 @sched_setaffinity(i32 0, {long} 128, ptr @aotc.pool.mask)
  br label %done
pin:
  %slot = urem i32 %k, %n
  %p = getelementptr i32, ptr @aotc.pool.cpus, i32 %slot
  %cpu = load atomic i32, ptr %p monotonic, align 4
  %valid = icmp ult i32 %cpu, 1024
  br i1 %valid, label %set, label %done
set:
  call void @llvm.memset.p0.i64(ptr align 8 %mask, i8 0, i64 128, i1 false)
  %word = lshr i32 %cpu, 6
  %bit = and i32 %cpu, 63
  %bit64 = zext i32 %bit to i64
  %one = shl i64 1, %bit64
  %w = getelementptr i64, ptr %mask, i32 %word
  store i64 %one, ptr %w, align 8
  call i32 @sched_setaffinity(i32 0, {long} 128, ptr %mask)
  br label %done
done:
  ret void
}}

define internal void @aotc.pool.init() #0 {{
entry:
  ; the mask is read once, before anything binds a thread; on failure it stays empty (one thread)
  %rc = call i32 @sched_getaffinity(i32 0, {long} 128, ptr @aotc.pool.mask)
  %read = icmp eq i32 %rc, 0
  %masked = zext i1 %read to i32
  store i32 %masked, ptr @aotc.pool.masked, align 4
  %p = call i32 @getpid()
  store atomic i32 %p, ptr @aotc.pool.pid monotonic, align 4
  ret void
}}

; A worker: spin for SPIN_NS waiting for a generation it has not seen, then sleep on the futex word `seq`.
define internal ptr @aotc.pool.worker(ptr %arg) #0 {{
entry:
  %seen = alloca i64, align 8
  %cur = alloca i64, align 8
  %spins = alloca i32, align 4
  %deadline = alloca i64, align 8
  %g0 = ptrtoint ptr %arg to i64
  store i64 %g0, ptr %seen, align 8
  %born = atomicrmw add ptr @aotc.pool.born, i32 1 monotonic, align 4
  %participant = add i32 %born, 1
  call void @aotc.pool.pin(i32 %participant)
  br label %idle
idle:
  %now0 = call i64 @aotc.pool.now_ns()
  %dl = add i64 %now0, {spin_ns}
  store i64 %dl, ptr %deadline, align 8
  store i32 0, ptr %spins, align 4
  br label %poll
poll:
  %stop = load atomic i32, ptr @aotc.pool.stop monotonic, align 4
  %stopping = icmp ne i32 %stop, 0
  br i1 %stopping, label %exit, label %poll.job
poll.job:
  %j = load atomic i64, ptr @aotc.pool.job acquire, align 8
  %g = lshr i64 %j, 32
  %s = load i64, ptr %seen, align 8
  %new = icmp ne i64 %g, %s
  br i1 %new, label %join, label %poll.spin
poll.spin:
  call void @aotc.pool.pause()
  %k = load i32, ptr %spins, align 4
  %k1 = add i32 %k, 1
  store i32 %k1, ptr %spins, align 4
  %low = and i32 %k1, 63
  %check = icmp eq i32 %low, 0
  br i1 %check, label %poll.clock, label %poll
poll.clock:
  %now = call i64 @aotc.pool.now_ns()
  %d = load i64, ptr %deadline, align 8
  %late = icmp sgt i64 %now, %d
  br i1 %late, label %sleep, label %poll
sleep:
  atomicrmw add ptr @aotc.pool.sleepers, i32 1 seq_cst, align 4
  %sq = load atomic i32, ptr @aotc.pool.seq seq_cst, align 4
  %j2 = load atomic i64, ptr @aotc.pool.job seq_cst, align 8
  %g2 = lshr i64 %j2, 32
  %s2 = load i64, ptr %seen, align 8
  %same = icmp eq i64 %g2, %s2
  %st2 = load atomic i32, ptr @aotc.pool.stop seq_cst, align 4
  %running = icmp eq i32 %st2, 0
  %wait = and i1 %same, %running
  br i1 %wait, label %sleep.wait, label %sleep.done
sleep.wait:
  %sq.long = {widen_u} i32 %sq to {long}
  call {long} ({long}, ...) @syscall({long} {futex}, ptr @aotc.pool.seq, {long} 128, {long} %sq.long, ptr null)
  br label %sleep.done
sleep.done:
  atomicrmw sub ptr @aotc.pool.sleepers, i32 1 seq_cst, align 4
  br label %idle
join:
  store i64 %j, ptr %cur, align 8
  br label %join.try
join.try:
  %c = load i64, ptr %cur, align 8
  %cg = lshr i64 %c, 32
  store i64 %cg, ptr %seen, align 8
  %closed = and i64 %c, 2147483648
  %is.closed = icmp ne i64 %closed, 0
  br i1 %is.closed, label %idle, label %join.count
join.count:
  %joined = and i64 %c, 2147483647
  %team = load atomic i32, ptr @aotc.pool.team monotonic, align 4
  %team64 = zext i32 %team to i64
  %full = icmp uge i64 %joined, %team64
  br i1 %full, label %idle, label %join.cas
join.cas:
  %c1 = add i64 %c, 1
  %pair = cmpxchg ptr @aotc.pool.job, i64 %c, i64 %c1 acq_rel acquire, align 8
  %old = extractvalue {{ i64, i1 }} %pair, 0
  %ok = extractvalue {{ i64, i1 }} %pair, 1
  store i64 %old, ptr %cur, align 8
  br i1 %ok, label %work, label %join.try
work:
  %fn = load ptr, ptr @aotc.pool.fn, align 8
  %cl = load ptr, ptr @aotc.pool.closure, align 8
  %tid = trunc i64 %joined to i32
  call void %fn(ptr %cl, i32 %tid, i32 %team)
  atomicrmw add ptr @aotc.pool.done, i32 1 release, align 4
  br label %idle
exit:
  ret ptr null
}}

; Start workers until `want` run (fewer if the system refuses a thread: the others take its chunks).
define internal void @aotc.pool.spawn(i32 %want) #0 {{
entry:
  %cap = icmp sgt i32 %want, {workers}
  %w = select i1 %cap, i32 {workers}, i32 %want
  br label %loop
loop:
  %s = load atomic i32, ptr @aotc.pool.started monotonic, align 4
  %enough = icmp sge i32 %s, %w
  br i1 %enough, label %done, label %create
create:
  %j = load atomic i64, ptr @aotc.pool.job monotonic, align 8
  %g = lshr i64 %j, 32
  %arg = inttoptr i64 %g to ptr
  %h = getelementptr {long}, ptr @aotc.pool.handles, i32 %s
  %rc = call i32 @pthread_create(ptr %h, ptr null, ptr @aotc.pool.worker, ptr %arg)
  %failed = icmp ne i32 %rc, 0
  br i1 %failed, label %done, label %next
next:
  %s1 = add i32 %s, 1
  store atomic i32 %s1, ptr @aotc.pool.started release, align 4
  br label %loop
done:
  ret void
}}

define {entry} void @aotc.pool.parallel(ptr %fn, ptr %closure, i32 %n) #0 {{
entry:
  %spins = alloca i32, align 4
  %single = icmp sle i32 %n, 1
  br i1 %single, label %serial, label %lock
serial:
  call void %fn(ptr %closure, i32 0, i32 1)
  ret void
lock:
  %acq = cmpxchg ptr @aotc.pool.busy, i32 0, i32 1 acquire monotonic, align 4
  %got = extractvalue {{ i32, i1 }} %acq, 1
  br i1 %got, label %owner, label %serial
owner:
  ; after fork() the child has none of the parent's workers
  %pid = call i32 @getpid()
  %known = load atomic i32, ptr @aotc.pool.pid monotonic, align 4
  %forked = icmp ne i32 %pid, %known
  br i1 %forked, label %reset, label %start
reset:
  store atomic i32 0, ptr @aotc.pool.started monotonic, align 4
  store atomic i32 0, ptr @aotc.pool.born monotonic, align 4
  store atomic i32 0, ptr @aotc.pool.sleepers monotonic, align 4
  store atomic i32 %pid, ptr @aotc.pool.pid monotonic, align 4
  br label %start
start:
  %want = sub i32 %n, 1
  call void @aotc.pool.spawn(i32 %want)
  %j = load atomic i64, ptr @aotc.pool.job monotonic, align 8
  %g = lshr i64 %j, 32
  %g1 = add i64 %g, 1
  %g1m = and i64 %g1, 4294967295
  %hi = shl i64 %g1m, 32
  %word = or i64 %hi, 1
  store ptr %fn, ptr @aotc.pool.fn, align 8
  store ptr %closure, ptr @aotc.pool.closure, align 8
  store atomic i32 %n, ptr @aotc.pool.team monotonic, align 4
  store atomic i32 0, ptr @aotc.pool.done monotonic, align 4
  store atomic i64 %word, ptr @aotc.pool.job release, align 8
  atomicrmw add ptr @aotc.pool.seq, i32 1 seq_cst, align 4
  %sleepers = load atomic i32, ptr @aotc.pool.sleepers seq_cst, align 4
  %any = icmp sgt i32 %sleepers, 0
  br i1 %any, label %wake, label %run
wake:
  call {long} ({long}, ...) @syscall({long} {futex}, ptr @aotc.pool.seq, {long} 129, {long} 2147483647)
  br label %run
run:
  call void %fn(ptr %closure, i32 0, i32 %n)
  br label %close
close:
  %c = load atomic i64, ptr @aotc.pool.job monotonic, align 8
  %cc = or i64 %c, 2147483648
  %cas = cmpxchg ptr @aotc.pool.job, i64 %c, i64 %cc acq_rel monotonic, align 8
  %closed = extractvalue {{ i64, i1 }} %cas, 1
  br i1 %closed, label %closed.ok, label %close
closed.ok:
  %joined64 = and i64 %c, 2147483647
  %joined = trunc i64 %joined64 to i32
  %others = sub i32 %joined, 1
  store i32 0, ptr %spins, align 4
  br label %wait
wait:
  %done = load atomic i32, ptr @aotc.pool.done acquire, align 4
  %all = icmp sge i32 %done, %others
  br i1 %all, label %finish, label %wait.more
wait.more:
  %k = load i32, ptr %spins, align 4
  %k1 = add i32 %k, 1
  store i32 %k1, ptr %spins, align 4
  %patient = icmp slt i32 %k, {join_spins}
  br i1 %patient, label %wait.pause, label %wait.yield
wait.pause:
  call void @aotc.pool.pause()
  br label %wait
wait.yield:
  call i32 @sched_yield()
  br label %wait
finish:
  store atomic i32 0, ptr @aotc.pool.busy release, align 4
  ret void
}}

; Runs when the library is unloaded or the process exits: stop the workers and wait for them to leave.
define {entry} void @aotc.pool.shutdown() #0 {{
entry:
  %i = alloca i32, align 4
  %pid = call i32 @getpid()
  %known = load atomic i32, ptr @aotc.pool.pid monotonic, align 4
  %ours = icmp eq i32 %pid, %known
  br i1 %ours, label %lock, label %done
lock:
  ; a region another thread still runs (at process exit) finishes first, and no worker starts meanwhile
  %acq = cmpxchg ptr @aotc.pool.busy, i32 0, i32 1 acquire monotonic, align 4
  %got = extractvalue {{ i32, i1 }} %acq, 1
  br i1 %got, label %locked, label %lock.wait
lock.wait:
  call i32 @sched_yield()
  br label %lock
locked:
  %n = load atomic i32, ptr @aotc.pool.started acquire, align 4
  %some = icmp sgt i32 %n, 0
  br i1 %some, label %stop, label %unlock
stop:
  store atomic i32 1, ptr @aotc.pool.stop seq_cst, align 4
  atomicrmw add ptr @aotc.pool.seq, i32 1 seq_cst, align 4
  call {long} ({long}, ...) @syscall({long} {futex}, ptr @aotc.pool.seq, {long} 129, {long} 2147483647)
  store i32 0, ptr %i, align 4
  br label %join
join:
  %k = load i32, ptr %i, align 4
  %h = getelementptr {long}, ptr @aotc.pool.handles, i32 %k
  %t = load {long}, ptr %h, align 8
  call i32 @pthread_join({long} %t, ptr null)
  %k1 = add i32 %k, 1
  store i32 %k1, ptr %i, align 4
  %more = icmp slt i32 %k1, %n
  br i1 %more, label %join, label %joined
joined:
  store atomic i32 0, ptr @aotc.pool.started monotonic, align 4
  store atomic i32 0, ptr @aotc.pool.born monotonic, align 4
  store atomic i32 0, ptr @aotc.pool.stop seq_cst, align 4
  br label %unlock
unlock:
  store atomic i32 0, ptr @aotc.pool.busy release, align 4
  br label %done
done:
  ret void
}}"""


def emit_thread_pool(mod: ModuleBuilder, arch: str, separate: bool = False) -> None:
    """Add the pool's state, its exported controls (`aotc_set_num_threads`, `aotc_set_call_threads`,
    `aotc_get_max_threads`, `aotc_bind_threads`) and the region entry to `mod`. `separate`: `mod` is the
    pool's own module, linked next to kernel modules made with `declare_thread_pool`."""
    if arch not in _ARCH:
        raise CodegenError(f"no thread pool for architecture {arch!r} (known: {', '.join(_ARCH)})")
    futex, pause, long = _ARCH[arch]
    fields = {
        "pause": f"call void @{pause[0]}({pause[1]})",
        "long": long,
        "widen": "bitcast" if long == "i64" else "sext",
        "widen_u": "zext" if long == "i64" else "bitcast",
        "futex": futex,
        "workers": MAX_TEAM - 1,
        "team": MAX_TEAM,
        "spin_ns": SPIN_NS,
        "join_spins": JOIN_SPINS,
        # hidden: visible to the kernel modules of the same library, not exported from it
        "entry": "hidden" if separate else "internal",
    }
    mod.globals.append(_GLOBALS.format(**fields))
    for name, line in _DECLS.items():
        mod.declare(name, line.format(**fields))
    mod.intrinsic(pause[0], "void", ["i32"] if pause[1] else [], " nounwind")
    mod.intrinsic("llvm.memset.p0.i64", "void", ["ptr", "i8", "i64", "i1"])
    mod.functions.append(_FUNCTIONS.format(**fields))
    if not separate:  # a separate pool is stopped by its kernel module's finalizer (declare_thread_pool)
        mod.finalizers.append(SHUTDOWN)  # first: no kernel runs while the heap caches are freed


def declare_thread_pool(mod: ModuleBuilder) -> None:
    """Make `mod`'s kernels call the pool of a module that `emit_thread_pool(..., separate=True)` built,
    and stop it first when the library is unloaded, as `emit_thread_pool` does in one module."""
    mod.declare(PARALLEL[1:], f"declare hidden void {PARALLEL}(ptr, ptr, i32) nounwind")
    mod.declare(TEAM_SIZE[1:], f"declare hidden i32 {TEAM_SIZE}() nounwind")
    mod.declare(SHUTDOWN[1:], f"declare hidden void {SHUTDOWN}() nounwind")
    mod.finalizers.append(SHUTDOWN)
