package diskspace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeFree is a free-space source the test sets.
type fakeFree struct{ free atomic.Uint64 }

func (f *fakeFree) get(string) (uint64, uint64, error) { return f.free.Load(), 1 << 30, nil }

func TestMonitor_RefusesBelowMinFreeAndResumesAboveMargin(t *testing.T) {
	ff := &fakeFree{}
	ff.free.Store(100 << 20)
	m := New(Config{Dir: "/data", MinFree: 64 << 20, Reserve: 16 << 20, Interval: time.Hour, free: ff.get})
	defer m.Close()
	if err := m.WriteErr(); err != nil {
		t.Fatalf("100 MiB free, min 64 MiB: %v", err)
	}
	ff.free.Store(60 << 20)
	m.Measure()
	err := m.WriteErr()
	var low *LowSpaceError
	if !errors.As(err, &low) || !errors.Is(err, ErrLowSpace) || low.Path != "/data" || low.Free != 60<<20 || low.MinFree != 64<<20 {
		t.Fatalf("60 MiB free: %v, want a LowSpaceError naming /data, 60 MiB and 64 MiB", err)
	}
	// Back to just above the minimum: still refused (margin of 1/16), and
	// the error says where writes resume, so "65 MiB free" does not read
	// as above a minimum of 64 MiB yet refused.
	ff.free.Store(65 << 20)
	if m.Measure(); !errors.As(m.WriteErr(), &low) || low.ResumeFree != 68<<20 {
		t.Fatalf("65 MiB free right after being low: %v, want refused until the 4 MiB margin", m.WriteErr())
	}
	if want := "data dir /data has 65.0 MiB free; writes are refused until 68.0 MiB are free (--min-free-disk 64.0 MiB, plus 1/16 once refused)"; !strings.Contains(low.Error(), want) {
		t.Fatalf("error %q, want %q", low.Error(), want)
	}
	ff.free.Store(69 << 20)
	if m.Measure(); m.WriteErr() != nil {
		t.Fatalf("69 MiB free: %v, want accepted", m.WriteErr())
	}
	if st := m.State(); st.Critical {
		t.Fatal("critical above the reserve")
	}
}

func TestMonitor_WaitRoomBlocksBelowReserveUntilSpaceReturnsOrClose(t *testing.T) {
	ff := &fakeFree{}
	ff.free.Store(8 << 20)
	m := New(Config{Dir: "/data", MinFree: 64 << 20, Reserve: 16 << 20, Interval: 10 * time.Millisecond, free: ff.get})
	if !m.State().Critical {
		t.Fatal("8 MiB free, reserve 16 MiB: not critical")
	}
	got := make(chan bool, 1)
	go func() { got <- m.WaitRoom(context.Background()) }()
	select {
	case r := <-got:
		t.Fatalf("WaitRoom returned %v while below the reserve", r)
	case <-time.After(100 * time.Millisecond): // it is still waiting (it returns only on the conditions below)
	}
	ff.free.Store(32 << 20)
	select {
	case r := <-got:
		if !r {
			t.Fatal("WaitRoom = false after space came back")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitRoom still blocked 10 s after space came back")
	}

	ff.free.Store(1 << 20)
	m.Measure()
	go func() { got <- m.WaitRoom(context.Background()) }()
	m.Close()
	select {
	case r := <-got:
		if r {
			t.Fatal("WaitRoom = true after Close while still below the reserve")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitRoom still blocked 10 s after Close")
	}
}

func TestMonitor_AutoThresholdFollowsStoreSize(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	ff := &fakeFree{}
	ff.free.Store(1 << 30)
	m := New(Config{Dir: dir, AutoBase: 64 << 20, AutoDir: dir, Reserve: 8 << 20, Interval: time.Hour, free: ff.get})
	defer m.Close()
	used, err := Allocated(dir)
	if err != nil || used < 1<<20 {
		t.Fatalf("Allocated = %d, %v; want at least the 1 MiB written", used, err)
	}
	if got, want := m.State().MinFree, uint64(64<<20+2*used); got != want {
		t.Fatalf("auto MinFree = %d, want 64 MiB + 2 × %d = %d", got, used, want)
	}
}

func TestFreeAndBytes(t *testing.T) {
	free, total, err := Free(t.TempDir())
	if err != nil || total == 0 || free > total {
		t.Fatalf("Free = %d of %d, %v", free, total, err)
	}
	if _, _, err := Free(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("Free of a missing dir: no error")
	}
	for n, want := range map[uint64]string{512: "512 B", 1536: "1.5 KiB", 16 << 20: "16.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestMonitor_NearTheThresholdAWriteMeasuresItself: the poller measures
// every Interval, which a fast writer outruns; near the threshold the
// write path measures again itself, so writes are refused once free space
// is below it without waiting for the next poll. Far above the threshold
// writes read the last poll only.
func TestMonitor_NearTheThresholdAWriteMeasuresItself(t *testing.T) {
	ff := &fakeFree{}
	ff.free.Store(70 << 20)
	m := New(Config{Dir: "/data", MinFree: 64 << 20, Reserve: 16 << 20, Interval: time.Hour, free: ff.get})
	defer m.Close()
	if err := m.WriteErr(); err != nil {
		t.Fatalf("70 MiB free, min 64 MiB: %v", err)
	}
	ff.free.Store(60 << 20) // the writes of the last few ms filled it
	deadline := time.Now().Add(10 * time.Second)
	for m.WriteErr() == nil {
		if time.Now().After(deadline) {
			t.Fatal("60 MiB free, min 64 MiB: writes still accepted; the write path waits for the hourly poll")
		}
		time.Sleep(time.Millisecond)
	}
	var low *LowSpaceError
	if !errors.As(m.WriteErr(), &low) || low.Free != 60<<20 {
		t.Fatalf("refusal %v, want one naming 60 MiB free", m.WriteErr())
	}

	// Far above the threshold a write does not measure.
	ff.free.Store(1 << 30)
	m.Measure()
	ff.free.Store(0)
	// Only once the last measurement is old enough to be redone near the
	// threshold does a write that did not measure prove anything.
	for time.Since(m.State().At) < nearRecheck {
		runtime.Gosched()
	}
	if err := m.WriteErr(); err != nil {
		t.Fatalf("1 GiB free at the last poll: %v; a write far from the threshold measured itself", err)
	}
}
