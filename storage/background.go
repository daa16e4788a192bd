package storage

import "github.com/cockroachdb/pebble/v2"

// Background work at a lower CPU priority.
//
// A node's foreground is a chain of short steps (a gRPC call, a Raft
// append and its fsync, the apply, the answer), each waiting for a core.
// Its background work comes in bursts of CPU: a Pebble compaction
// (hundreds of ms of a core after a write burst), a Pebble flush and the
// FSM's commit of its write buffer (50-150 ms each, every few seconds,
// and on every replica at once since replicas commit at the same entry).
// On a machine the node shares (three nodes and their clients on two
// cores in our benchmark; any busy host in production), a burst at equal
// priority makes every call in flight wait behind it: it was where most
// of the 3-node 50x1 calls over 15 ms came from (docs/PERFORMANCE.md).
// So, as RocksDB's LowerThreadPoolCPUPriority, the goroutine of each such
// job locks itself to an OS thread and lowers that thread's priority
// (setpriority on the thread ID, a nice value): the kernel runs it when
// the foreground leaves a core free. The thread ends with the goroutine
// (it is never unlocked), so no other goroutine runs at that priority.
// Every such job runs on a goroutine of its own: Pebble starts one per
// flush and per compaction, and DB.Background starts one per commit.
//
// Go's scheduler does not see thread priorities: a goroutine on a thread
// the kernel has set aside still holds one of GOMAXPROCS Ps, and with
// GOMAXPROCS equal to the cores a compaction then took half of a 2-core
// node's Ps from its foreground (measured: the 50x1 tail was worse than
// without lowering). A process that lowers background priority therefore
// runs with one P more than its cores (serve and dev do, in
// cmd/dedupnode); the extra P lets the foreground keep as many Ps as there
// are cores while one is held by a thread the kernel ranks last.
//
// What lowered priority can delay: the end of a compaction or flush
// applies its version edit under Pebble's DB mutex on the same thread,
// and a commit waits for that mutex only when it rotates the memtable
// (a few times a minute); a low-priority job that holds it waits at most
// for the kernel's next turn of a busy core.

// lowerBackgroundPriority makes Pebble's flushes and compactions run at
// nice on their own threads.
func lowerBackgroundPriority(l *pebble.EventListener, nice int) {
	flushBegin, compactionBegin := l.FlushBegin, l.CompactionBegin
	l.FlushBegin = func(info pebble.FlushInfo) {
		lowerThreadPriority(nice)
		if flushBegin != nil {
			flushBegin(info)
		}
	}
	l.CompactionBegin = func(info pebble.CompactionInfo) {
		lowerThreadPriority(nice)
		if compactionBegin != nil {
			compactionBegin(info)
		}
	}
}

// Background runs fn on a goroutine of its own at the database's
// background priority (Options.BackgroundNice) and returns when it has
// returned; with no lowered priority it runs fn in place.
func (d *DB) Background(fn func()) {
	if d.nice == 0 || !CanLowerPriority {
		fn()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		lowerThreadPriority(d.nice)
		fn()
	}()
	<-done
}
