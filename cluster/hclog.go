package cluster

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter routes hashicorp/raft's hclog output into one slog.Logger.
// Messages below minLevel are dropped before any formatting work, so raft's
// DEBUG chatter costs nothing.
type hclogAdapter struct {
	l        *slog.Logger
	name     string
	minLevel hclog.Level
	implied  []any
}

var _ hclog.Logger = (*hclogAdapter)(nil)

func newHCLogger(l *slog.Logger, minLevel hclog.Level) hclog.Logger {
	return &hclogAdapter{l: l, minLevel: minLevel}
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
	if !a.enabled(level) {
		return
	}
	attrs := make([]any, 0, len(a.implied)+len(args)+2)
	if a.name != "" {
		attrs = append(attrs, "raft_logger", a.name)
	}
	attrs = append(attrs, a.implied...)
	attrs = append(attrs, args...)
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
