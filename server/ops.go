package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/fsm"
	"github.com/dedupnode/dedupnode/storage"
)

// opsServer implements dedupv1.OpsServer: promotion, backup, export.
type opsServer struct {
	dedupv1.UnimplementedOpsServer
	s *Server
}

// Promote implements dedupv1.OpsServer. Forwarded to the leader.
func (o *opsServer) Promote(ctx context.Context, req *dedupv1.PromoteRequest) (*dedupv1.PromoteResponse, error) {
	if req.NodeId == "" {
		return nil, toStatus(invalidf("node_id", "required"))
	}
	s := o.s
	err := s.onLeader(ctx, func(ctx context.Context) error {
		return s.node.Promote(ctx, req.NodeId, req.Force)
	}, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := dedupv1.NewOpsClient(cc).Promote(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &dedupv1.PromoteResponse{}, nil
}

// backupChunk is the size of one Backup message.
const backupChunk = 256 << 10

// Backup implements dedupv1.OpsServer: a read barrier (every write
// acknowledged before the call is applied here), then the FSM's snapshot
// stream, in chunks.
func (o *opsServer) Backup(_ *dedupv1.BackupRequest, stream grpc.ServerStreamingServer[dedupv1.BackupChunk]) error {
	s := o.s
	ctx := stream.Context()
	if err := s.linearize(ctx); err != nil {
		return toStatus(err)
	}
	snap, err := s.node.FSM().Snapshot()
	if err != nil {
		return toStatus(fmt.Errorf("take snapshot: %w", err))
	}
	defer snap.Release()
	sink := &streamSink{stream: stream, buf: make([]byte, 0, backupChunk)}
	if err := snap.Persist(sink); err != nil {
		if sink.err != nil {
			return sink.err // the client went away: its own status
		}
		return toStatus(err)
	}
	return nil
}

// streamSink is a raft.SnapshotSink that sends what is written as
// BackupChunks; the first carries the snapshot's index and term (read from
// the stream header with fsm.ParseSnapshotHeader).
type streamSink struct {
	stream grpc.ServerStreamingServer[dedupv1.BackupChunk]
	buf    []byte
	sent   bool
	err    error
}

func (k *streamSink) Write(p []byte) (int, error) {
	if k.err != nil {
		return 0, k.err
	}
	n := len(p)
	for len(p) > 0 {
		room := cap(k.buf) - len(k.buf)
		take := min(room, len(p))
		k.buf = append(k.buf, p[:take]...)
		p = p[take:]
		if len(k.buf) == cap(k.buf) {
			if err := k.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (k *streamSink) flush() error {
	if len(k.buf) == 0 {
		return nil
	}
	msg := &dedupv1.BackupChunk{Data: k.buf}
	if !k.sent {
		if h, err := fsm.ParseSnapshotHeader(k.buf); err == nil {
			msg.Index, msg.Term = h.Index, h.Term
		}
	}
	if err := k.stream.Send(msg); err != nil {
		k.err = err
		return err
	}
	k.sent = true
	k.buf = make([]byte, 0, backupChunk)
	return nil
}

func (k *streamSink) Close() error  { return k.flush() }
func (k *streamSink) ID() string    { return "backup" }
func (k *streamSink) Cancel() error { return nil }

// exportBatch is how many records one ExportChunk carries.
const exportBatch = 1000

// exportKeepalive: an export that has found nothing to send for this long
// (it walks the whole store, and the namespace's records may be few, or
// expired) sends an empty chunk, so that a client's idle bound
// (client.WithStreamIdleTimeout, the CLI's --timeout) measures a node
// that stopped answering, not one scanning past other records.
const exportKeepalive = time.Second

// Export implements dedupv1.OpsServer: a read barrier, then the live
// records of one namespace — committed records and live leases, each with
// its digest, request token and fencing token. It walks a snapshot stream
// of the FSM (fsm.WalkSnapshot) for the namespace's record keys: at most one
// record per ID exists, so each ID is sent once, in the state of one
// consistent snapshot. The first chunk carries the fencing epoch (sent even
// when nothing else is); the last counts what was left out as absent
// (released leases, expired records).
func (o *opsServer) Export(req *dedupv1.ExportRequest, stream grpc.ServerStreamingServer[dedupv1.ExportChunk]) error {
	s := o.s
	ctx := stream.Context()
	name := req.Namespace
	if name == "" {
		name = fsm.DefaultNamespace
	}
	if err := s.linearize(ctx); err != nil {
		return toStatus(err)
	}
	f := s.node.FSM()
	ns, ok := f.Namespace(name)
	if !ok {
		return toStatus(&fsm.NamespaceError{Name: name, Err: fsm.ErrNamespaceNotFound})
	}
	snap, err := f.Snapshot()
	if err != nil {
		return toStatus(fmt.Errorf("take snapshot: %w", err))
	}
	// Read after the snapshot: the epoch never goes down, so the one sent
	// is at least the snapshot's.
	epoch := f.FenceEpoch()
	now := max(time.Now().UnixMilli(), f.LastTimestamp())
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer snap.Release()
		pw.CloseWithError(snap.Persist(&pipeSink{pw}))
	}()
	defer func() {
		pr.CloseWithError(errors.New("export ended"))
		<-done
	}()

	out := &dedupv1.ExportChunk{FenceEpoch: epoch}
	first := true
	var released, expired uint64
	lastSend, seen := time.Now(), 0
	// send sends what out holds: nothing unless it holds records, is the
	// first or last chunk, or keeps the export alive (keepalive).
	send := func(last, keepalive bool) error {
		if len(out.Records) == 0 && !first && !last && !keepalive {
			return nil
		}
		if last {
			out.SkippedReleased, out.SkippedExpired = released, expired
		}
		if err := stream.Send(out); err != nil {
			return err
		}
		first, lastSend = false, time.Now()
		out = &dedupv1.ExportChunk{}
		return nil
	}
	_, err = fsm.WalkSnapshot(pr, func(key, value []byte) error {
		if seen++; seen%1024 == 0 && time.Since(lastSend) >= exportKeepalive {
			// Nothing to send for a while: an empty chunk (the
			// records found so far go with it) says the export is alive.
			if err := send(false, true); err != nil {
				return err
			}
		}
		nsID, _, _, id, ok := storage.ParseRecordKey(key)
		if !ok || nsID != ns.ID {
			return nil
		}
		r, err := fsm.DecodeRecord(value)
		if err != nil {
			return fmt.Errorf("record %q: %w", id, err)
		}
		switch {
		case r.ExpiresMs <= now:
			expired++
			return nil
		case r.State == fsm.StateReleased:
			released++
			return nil
		}
		out.Records = append(out.Records, &dedupv1.ExportedRecord{
			Id:              append([]byte(nil), id...),
			State:           dedupv1.RecordState(r.State),
			FirstSeenUnixMs: r.FirstSeenMs,
			ExpiresUnixMs:   r.ExpiresMs,
			Digest:          append([]byte(nil), r.Digest...),
			RequestToken:    append([]byte(nil), r.Token...),
			FencingToken:    r.Fence,
		})
		if len(out.Records) >= exportBatch {
			return send(false, false)
		}
		return nil
	})
	if err != nil {
		return toStatus(fmt.Errorf("export %s: %w", name, err))
	}
	return send(true, false)
}

// RaiseFenceEpoch implements dedupv1.OpsServer: proposes
// OpRaiseFenceEpoch on the leader (forwarded there).
func (o *opsServer) RaiseFenceEpoch(ctx context.Context, req *dedupv1.RaiseFenceEpochRequest) (*dedupv1.RaiseFenceEpochResponse, error) {
	if req.AtLeast > fsm.MaxFenceEpoch {
		return nil, toStatus(invalidf("at_least", "%d exceeds the largest fencing epoch, %d", req.AtLeast, uint64(fsm.MaxFenceEpoch)))
	}
	s := o.s
	var resp *dedupv1.RaiseFenceEpochResponse
	err := s.onLeader(ctx, func(ctx context.Context) error {
		res, err := s.node.Propose(ctx, []fsm.Op{{Kind: fsm.OpRaiseFenceEpoch, FenceEpoch: req.AtLeast}})
		if err != nil {
			return err
		}
		if res[0].Err != nil {
			return res[0].Err
		}
		resp = &dedupv1.RaiseFenceEpochResponse{FenceEpoch: res[0].FenceEpoch}
		return nil
	}, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = dedupv1.NewOpsClient(cc).RaiseFenceEpoch(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// SetClusterSetting implements dedupv1.OpsServer: records a cluster
// setting through the log on the leader (forwarded there).
func (o *opsServer) SetClusterSetting(ctx context.Context, req *dedupv1.SetClusterSettingRequest) (*dedupv1.SetClusterSettingResponse, error) {
	if req.Name == "" {
		return nil, toStatus(invalidf("name", "required (known: %s)", cluster.SettingPreferredLeaderRegions))
	}
	s := o.s
	err := s.onLeader(ctx, func(ctx context.Context) error {
		return s.node.SetSetting(ctx, req.Name, req.Value, req.Unset)
	}, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := dedupv1.NewOpsClient(cc).SetClusterSetting(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &dedupv1.SetClusterSettingResponse{}, nil
}

type pipeSink struct{ *io.PipeWriter }

func (p *pipeSink) ID() string    { return "export" }
func (p *pipeSink) Cancel() error { return nil }
func (p *pipeSink) Close() error  { return nil } // closed by the caller with Persist's error

// Digest implements dedupv1.OpsServer: this node's state digest with the
// applied index it covers (fsm.DigestState), from its own state — no
// forwarding, no read barrier, so that every replica can be asked and
// compared. Codes: Unavailable while the node shuts down, Canceled or
// DeadlineExceeded when the caller gives up during the scan, Internal on a
// storage error.
func (o *opsServer) Digest(ctx context.Context, _ *dedupv1.DigestRequest) (*dedupv1.DigestResponse, error) {
	d, err := o.s.node.FSM().DigestState(ctx)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, status.FromContextError(cerr).Err()
		}
		return nil, toStatus(err)
	}
	return &dedupv1.DigestResponse{
		NodeId:            o.s.cfg.Cluster.NodeID,
		Digest:            d.Digest,
		AppliedIndex:      d.AppliedIndex,
		AppliedTerm:       d.AppliedTerm,
		Records:           d.Records,
		Keys:              d.Keys,
		LastAppliedUnixMs: d.LastTsMs,
	}, nil
}
