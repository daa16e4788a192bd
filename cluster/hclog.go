package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter routes hashicorp/raft's hclog output into one slog.Logger.
// Messages below minLevel are dropped before any formatting work, so raft's
// DEBUG chatter costs nothing.
//
// A WARN or ERROR whose error is a connection going away (closed by this
// node, or EOF/reset from a peer) is logged at DEBUG when this node closed
// the connection itself or is stopping: raft reports every connection its
// own shutdown (or a peer's, at the same moment) cuts, e.g. "failed to
// decode incoming command: use of closed network connection".
//
// A WARN or ERROR that raft can repeat once per round trip (repeatedMsgs)
// is let through once per second per message; the next one let through
// carries how many were dropped ("repeated").
type hclogAdapter struct {
	l        *slog.Logger
	name     string
	minLevel hclog.Level
	implied  []any
	stopping *atomic.Bool // nil: never
	repeats  *repeatLimiter
}

// repeatedMsgs are raft's messages that come once per round trip while a
// follower cannot take entries: a leader walking nextIndex back after a
// failed append logged 80,000 "appendEntries rejected, sending older logs"
// in 37 s (15.7 MB of log), its follower as many "failed to get previous
// log".
var repeatedMsgs = map[string]bool{
	"appendEntries rejected, sending older logs": true,
	"failed to get previous log":                 true,
	"failed to append to logs":                   true,
}

// repeatLimiter lets one line of a message through per interval and
// counts the others. Safe for concurrent use.
type repeatLimiter struct {
	every time.Duration
	now   func() time.Time // time.Now; tests step a clock

	mu      sync.Mutex
	last    map[string]time.Time
	dropped map[string]int
}

func newRepeatLimiter(every time.Duration) *repeatLimiter {
	return &repeatLimiter{every: every, now: time.Now, last: map[string]time.Time{}, dropped: map[string]int{}}
}

// allow says whether a line of msg is logged now and how many were dropped
// since the last one that was.
func (r *repeatLimiter) allow(msg string) (ok bool, dropped int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if last, seen := r.last[msg]; seen && now.Sub(last) < r.every {
		r.dropped[msg]++
		return false, 0
	}
	r.last[msg] = now
	dropped = r.dropped[msg]
	delete(r.dropped, msg)
	return true, dropped
}

var _ hclog.Logger = (*hclogAdapter)(nil)

// newHCLogger returns an adapter logging to l from minLevel on; stopping,
// when not nil, says that the node is shutting down.
func newHCLogger(l *slog.Logger, minLevel hclog.Level, stopping *atomic.Bool) hclog.Logger {
	return &hclogAdapter{l: l, minLevel: minLevel, stopping: stopping, repeats: newRepeatLimiter(time.Second)}
}

// connGone reports whether err (an error or its text) is a connection
// ending under us: closed by this node, or EOF, reset or refused because
// the peer went away.
func connGone(err any) bool {
	var s string
	switch e := err.(type) {
	case error:
		if errors.Is(e, net.ErrClosed) || errors.Is(e, io.EOF) || errors.Is(e, io.ErrUnexpectedEOF) ||
			errors.Is(e, syscall.ECONNRESET) || errors.Is(e, syscall.EPIPE) || errors.Is(e, syscall.ECONNREFUSED) {
			return true
		}
		s = e.Error()
	case string:
		s = e
	default:
		return false
	}
	for _, p := range []string{"use of closed network connection", "EOF", "connection reset by peer", "broken pipe", "connection refused"} {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// shutdownNoise says whether a WARN/ERROR with these key-value args is a
// connection cut by a shutdown (see hclogAdapter).
func (a *hclogAdapter) shutdownNoise(args []any) bool {
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k != "error" && k != "err" {
			continue
		}
		if !connGone(args[i+1]) {
			return false
		}
		closedHere := errors.Is(asError(args[i+1]), net.ErrClosed) || strings.Contains(fmt.Sprint(args[i+1]), "use of closed network connection")
		return closedHere || a.stopping != nil && a.stopping.Load()
	}
	return false
}

func asError(v any) error {
	e, _ := v.(error)
	return e
}

func toSlogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Info, hclog.NoLevel, hclog.DefaultLevel:
		return slog.LevelInfo
	case hclog.Warn:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (a *hclogAdapter) enabled(level hclog.Level) bool {
	if level == hclog.Off || a.minLevel == hclog.Off {
		return false
	}
	return level >= a.minLevel
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level >= hclog.Warn && level != hclog.Off && a.shutdownNoise(args) {
		level = hclog.Debug
	}
	if !a.enabled(level) {
		return
	}
	var dropped int
	if level >= hclog.Warn && a.repeats != nil && repeatedMsgs[msg] {
		var ok bool
		if ok, dropped = a.repeats.allow(msg); !ok {
			return
		}
	}
	attrs := make([]any, 0, len(a.implied)+len(args)+4)
	if a.name != "" {
		attrs = append(attrs, "raft_logger", a.name)
	}
	attrs = append(attrs, a.implied...)
	attrs = append(attrs, args...)
	if dropped > 0 {
		attrs = append(attrs, "repeated", dropped)
	}
	a.l.Log(context.Background(), toSlogLevel(level), msg, attrs...)
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) IsTrace() bool { return a.enabled(hclog.Trace) }
func (a *hclogAdapter) IsDebug() bool { return a.enabled(hclog.Debug) }
func (a *hclogAdapter) IsInfo() bool  { return a.enabled(hclog.Info) }
func (a *hclogAdapter) IsWarn() bool  { return a.enabled(hclog.Warn) }
func (a *hclogAdapter) IsError() bool { return a.enabled(hclog.Error) }

func (a *hclogAdapter) ImpliedArgs() []any { return a.implied }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	c := *a
	c.implied = append(append([]any(nil), a.implied...), args...)
	return &c
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	c := *a
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *a
	c.name = name
	return &c
}

// SetLevel changes the minimum level of this adapter only.
func (a *hclogAdapter) SetLevel(level hclog.Level) { a.minLevel = level }

func (a *hclogAdapter) GetLevel() hclog.Level { return a.minLevel }

func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(opts), "", 0)
}

func (a *hclogAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	return stdWriter{a: a}
}

// stdWriter turns standard-library log lines (e.g. "[WARN] raft: ...") into
// adapter calls, honouring a leading level tag when present.
type stdWriter struct{ a *hclogAdapter }

func (w stdWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := hclog.Info
	for tag, l := range map[string]hclog.Level{
		"[TRACE]": hclog.Trace, "[DEBUG]": hclog.Debug, "[INFO]": hclog.Info,
		"[WARN]": hclog.Warn, "[ERR]": hclog.Error, "[ERROR]": hclog.Error,
	} {
		if strings.HasPrefix(line, tag) {
			level = l
			line = strings.TrimSpace(strings.TrimPrefix(line, tag))
			break
		}
	}
	w.a.Log(level, fmt.Sprint(line))
	return len(p), nil
}
