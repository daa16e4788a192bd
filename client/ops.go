package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// The operator calls of the dedup.v1.Ops service: promotion, backups,
// export, state digests. The CLI and every tool reach them through here.

// ErrBackupDamaged: a backup stream's trailing SHA-256 does not match its
// content. Nothing a backup wrote to its writer may be used.
var ErrBackupDamaged = errors.New("backup stream is damaged: checksum mismatch")

// ErrStreamIdle: a Backup or Export attempt received nothing from its node
// for the WithStreamIdleTimeout (the first message included: the node
// accepted the connection, or the call, but does not answer; frozen,
// overloaded, or cut off). The error's Addr names the node. Before any data
// was delivered the call is retried like any failed attempt; after, it
// fails, as a broken stream does.
var ErrStreamIdle = errors.New("stream idle: no data from the node")

// WithStreamIdleTimeout bounds each wait of a Backup or Export attempt for
// its node's next message, the first one included (connecting and the
// node's read barrier come before it), to d; d <= 0 (the default) leaves
// the waits bounded by the caller's context alone. It is a progress bound,
// not a deadline: a backup of a big store takes as long as it takes, as
// long as data keeps coming. A node sends an export's progress at least
// every second even while it scans past other namespaces' records.
func WithStreamIdleTimeout(d time.Duration) Option {
	return func(o *options) { o.streamIdle = d }
}

// idleWatch cancels a stream attempt's context when nothing arrived for
// the client's stream idle timeout. A nil *idleWatch watches nothing.
type idleWatch struct {
	d   time.Duration
	t   *time.Timer
	ctx context.Context
}

// watchIdle returns ctx under an idle watch (started now) and its stop.
func (c *Client) watchIdle(ctx context.Context) (context.Context, *idleWatch, func()) {
	d := c.opts.streamIdle
	if d <= 0 {
		return ctx, nil, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	w := &idleWatch{d: d, ctx: ctx}
	w.t = time.AfterFunc(d, func() { cancel(ErrStreamIdle) })
	return ctx, w, func() { w.t.Stop(); cancel(nil) }
}

// wait starts a wait for the next message; got ends it (the time the
// caller spends on a message is not the node's).
func (w *idleWatch) wait() {
	if w != nil {
		w.t.Reset(w.d)
	}
}

func (w *idleWatch) got() {
	if w != nil {
		w.t.Stop()
	}
}

// check turns err, the failure of a call or Recv under the watch, into an
// ErrStreamIdle (keeping err's status, so that invoke retries it while
// nothing was delivered) when the watch ended it.
func (w *idleWatch) check(err error) error {
	if w == nil || err == nil || !errors.Is(context.Cause(w.ctx), ErrStreamIdle) {
		return err
	}
	return &idleError{st: status.New(codes.DeadlineExceeded, fmt.Sprintf("%v for %v", ErrStreamIdle, w.d))}
}

// idleError is ErrStreamIdle with the attempt's status (DeadlineExceeded:
// retried as an attempt timeout).
type idleError struct{ st *status.Status }

func (e *idleError) Error() string              { return e.st.Message() }
func (e *idleError) Unwrap() error              { return ErrStreamIdle }
func (e *idleError) GRPCStatus() *status.Status { return e.st }

// errPartial marks a stream that failed after it delivered data: retrying
// it would repeat what the caller already received.
var errPartial = errors.New("stream broke after delivering data")

// Promote makes the non-voter nodeID a voter at once (the leader does it by
// itself once the node has caught up). The leader refuses a node it cannot
// reach or that has not caught up. Errors: ErrNodeNotFound, ErrNotCaughtUp.
func (c *Client) Promote(ctx context.Context, nodeID string) error {
	return c.promote(ctx, nodeID, false)
}

// ForcePromote is Promote without the leader's check that the node is
// reachable and caught up: a voter that is down costs the cluster the
// failure it could otherwise survive.
func (c *Client) ForcePromote(ctx context.Context, nodeID string) error {
	return c.promote(ctx, nodeID, true)
}

func (c *Client) promote(ctx context.Context, nodeID string, force bool) error {
	return c.invoke(ctx, "promote", toLeader, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := dedupv1.NewOpsClient(cc).Promote(ctx, &dedupv1.PromoteRequest{NodeId: nodeID, Force: force})
		return err
	})
}

// BackupInfo describes a backup written by Backup.
type BackupInfo struct {
	Index uint64 // Raft index the state is as of
	Bytes int64  // bytes written, checksum included
}

// Backup streams a consistent snapshot of the whole cluster state (taken
// after a linearizable read barrier: it holds every write acknowledged
// before the call) to w, and verifies the SHA-256 the stream ends with.
// The stream is retried while nothing has been written to w; a failure
// after that, or ErrBackupDamaged, means w holds no usable backup. ctx
// bounds the whole stream (a big backup takes as long as it takes: give it
// no short deadline; WithStreamIdleTimeout bounds each wait for data). cluster.SeedFromBackup restores what w received.
func (c *Client) Backup(ctx context.Context, w io.Writer) (BackupInfo, error) {
	var info BackupInfo
	err := c.stream(ctx, "backup", func(ctx context.Context, cc *grpc.ClientConn) error {
		ctx, idle, stop := c.watchIdle(ctx)
		defer stop()
		st, err := dedupv1.NewOpsClient(cc).Backup(ctx, &dedupv1.BackupRequest{})
		if err != nil {
			return idle.check(err)
		}
		v := newTailVerifier()
		for {
			idle.wait()
			ch, err := st.Recv()
			idle.got()
			err = idle.check(err)
			if errors.Is(err, io.EOF) {
				if !v.ok() {
					return ErrBackupDamaged
				}
				return nil
			}
			if err != nil {
				return partial(info.Bytes > 0, err)
			}
			if info.Bytes == 0 {
				info.Index = ch.GetIndex()
			}
			if _, err := w.Write(ch.GetData()); err != nil {
				return fmt.Errorf("%w: write backup: %w", errPartial, err)
			}
			v.write(ch.GetData())
			info.Bytes += int64(len(ch.GetData()))
		}
	})
	return info, err
}

// tailVerifier checks that a stream ends with the SHA-256 of what precedes
// it, without knowing the length in advance.
type tailVerifier struct {
	h    hash.Hash
	tail []byte // the last (up to) 32 bytes seen
}

func newTailVerifier() *tailVerifier { return &tailVerifier{h: sha256.New()} }

func (v *tailVerifier) write(b []byte) {
	v.tail = append(v.tail, b...)
	if n := len(v.tail) - sha256.Size; n > 0 {
		v.h.Write(v.tail[:n])
		v.tail = append(v.tail[:0], v.tail[n:]...)
	}
}

func (v *tailVerifier) ok() bool {
	return len(v.tail) == sha256.Size && bytes.Equal(v.h.Sum(nil), v.tail)
}

// ExportedRecord is one live record of an export.
type ExportedRecord struct {
	ID []byte
	// State is StateCommitted or StateLeased (Expires is then the lease's
	// expiry).
	State     RecordState
	FirstSeen time.Time
	Expires   time.Time
	// Digest and RequestToken were recorded with the ID (nil if none).
	Digest       []byte
	RequestToken []byte
	// FencingToken is the token of the ID's latest claim (0 if never
	// claimed).
	FencingToken uint64
}

// ExportInfo describes an export as a whole.
type ExportInfo struct {
	// FenceEpoch is the exporting cluster's fencing epoch (the high 16
	// bits of its fencing tokens); known before the first record.
	FenceEpoch uint64
	// SkippedReleased and SkippedExpired count the namespace's records
	// left out because they answer as absent: released leases not yet
	// forgotten, and records or leases whose expiry has passed. Known once
	// the export is complete.
	SkippedReleased, SkippedExpired uint64
}

// Export calls fn for every live ID of namespace (committed, or leased
// with a live lease) as of a linearizable read barrier, in key order. An
// error from fn stops the export and is returned. Needs the admin right on
// the namespace when the cluster runs with tokens. Errors:
// ErrNamespaceNotFound.
func (c *Client) Export(ctx context.Context, namespace string, fn func(ExportedRecord) error) error {
	_, err := c.ExportWithInfo(ctx, namespace, nil, fn)
	return err
}

// ExportWithInfo is Export that also calls begin (if not nil) once, before
// the first record, with the cluster's fencing epoch, and returns the
// export's ExportInfo (with the counts of records left out).
func (c *Client) ExportWithInfo(ctx context.Context, namespace string, begin func(ExportInfo) error, fn func(ExportedRecord) error) (ExportInfo, error) {
	var info ExportInfo
	err := c.stream(ctx, "export", func(ctx context.Context, cc *grpc.ClientConn) error {
		ctx, idle, stop := c.watchIdle(ctx)
		defer stop()
		st, err := dedupv1.NewOpsClient(cc).Export(ctx, &dedupv1.ExportRequest{Namespace: namespace})
		if err != nil {
			return idle.check(err)
		}
		n := 0
		for first := true; ; first = false {
			idle.wait()
			ch, err := st.Recv()
			idle.got()
			err = idle.check(err)
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return partial(n > 0 || (!first && begin != nil), err)
			}
			if first {
				info.FenceEpoch = ch.GetFenceEpoch()
				if begin != nil {
					if err := begin(info); err != nil {
						return fmt.Errorf("%w: %w", errPartial, err)
					}
				}
			}
			info.SkippedReleased += ch.GetSkippedReleased()
			info.SkippedExpired += ch.GetSkippedExpired()
			for _, r := range ch.GetRecords() {
				rec := ExportedRecord{ID: r.GetId(), State: StateCommitted,
					FirstSeen: time.UnixMilli(r.GetFirstSeenUnixMs()).UTC(), Expires: time.UnixMilli(r.GetExpiresUnixMs()).UTC(),
					Digest: nilIfEmpty(r.GetDigest()), RequestToken: nilIfEmpty(r.GetRequestToken()), FencingToken: r.GetFencingToken()}
				if r.GetState() == dedupv1.RecordState_RECORD_STATE_LEASED {
					rec.State = StateLeased
				}
				if err := fn(rec); err != nil {
					return fmt.Errorf("%w: %w", errPartial, err)
				}
				n++
			}
		}
	})
	return info, err
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// RaiseFenceEpoch raises the cluster's fencing epoch (the high 16 bits of
// every fencing token granted afterwards) to at least atLeast, through the
// Raft log, and returns the epoch in force. An import of another cluster's
// export raises it past the source's, so that the importing cluster's
// fencing tokens exceed every token the source can grant. Needs the admin
// right on "*" when the cluster runs with tokens. Errors:
// ErrInvalidArgument (past 65535), ErrPermissionDenied.
func (c *Client) RaiseFenceEpoch(ctx context.Context, atLeast uint64) (uint64, error) {
	var epoch uint64
	err := c.invoke(ctx, "raise-fence-epoch", toLeader, func(ctx context.Context, cc *grpc.ClientConn) error {
		resp, err := dedupv1.NewOpsClient(cc).RaiseFenceEpoch(ctx, &dedupv1.RaiseFenceEpochRequest{AtLeast: atLeast})
		if err != nil {
			return err
		}
		epoch = resp.GetFenceEpoch()
		return nil
	})
	return epoch, err
}

// DigestOf asks the node at addr (host:port) for a SHA-256 digest of its
// whole state and the applied index it covers, with a single attempt: no
// retries, no redirection (a digest is about that replica).
func (c *Client) DigestOf(ctx context.Context, addr string) (*dedupv1.DigestResponse, error) {
	return onceAt(c, ctx, "digest", addr, func(ctx context.Context, cc *grpc.ClientConn) (*dedupv1.DigestResponse, error) {
		return dedupv1.NewOpsClient(cc).Digest(ctx, &dedupv1.DigestRequest{})
	})
}

// stream runs a streaming call with invoke's retries, but no retry once
// the stream delivered data to the caller (errPartial).
func (c *Client) stream(ctx context.Context, op string, fn func(context.Context, *grpc.ClientConn) error) error {
	return c.invoke(ctx, op, toLeaderStream, fn)
}

// partial marks err as a mid-stream failure when data was delivered.
func partial(delivered bool, err error) error {
	if delivered {
		return fmt.Errorf("%w: %w", errPartial, err)
	}
	return err
}

// SetClusterSetting sets a replicated cluster setting through the Raft log
// (forwarded to the leader); unset clears it. Known settings:
// "preferred-leader-regions" (comma-separated regions; leadership moves to
// a caught-up voter in the first one that has one). Errors:
// InvalidArgument for an unknown name or a bad value.
func (c *Client) SetClusterSetting(ctx context.Context, name, value string, unset bool) error {
	req := &dedupv1.SetClusterSettingRequest{Name: name, Value: value, Unset: unset}
	return c.invoke(ctx, "set cluster setting", toLeader, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := dedupv1.NewOpsClient(cc).SetClusterSetting(ctx, req)
		return err
	})
}
