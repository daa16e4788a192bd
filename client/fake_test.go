package client

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeStore is the shared state of a fake cluster: enough of the dedup
// semantics (mark with request tokens) to test the client's routing and
// retries without Raft.
type fakeStore struct {
	mu      sync.Mutex
	records map[string]*dedupv1.Record // namespace + "\x00" + id
	leader  *fakeNode
	nowMs   int64
}

func newFakeStore() *fakeStore {
	return &fakeStore{records: map[string]*dedupv1.Record{}, nowMs: 1_700_000_000_000}
}

// fakeNode is one fake dedupnode server on a loopback port.
type fakeNode struct {
	dedupv1.UnimplementedDedupServer
	dedupv1.UnimplementedAdminServer

	id    string
	addr  string
	store *fakeStore
	srv   *grpc.Server

	mu sync.Mutex
	// failNext makes the next n write calls fail with Unavailable before
	// applying anything.
	failNext int
	// dropReplies makes the next n write calls apply, then fail with
	// Unavailable as if the reply was lost (leader crash after commit).
	dropReplies int
	calls       map[string]int
	tokens      [][]byte // request tokens of every Mark call received
}

func startFake(t *testing.T, store *fakeStore, id string) *fakeNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{id: id, addr: lis.Addr().String(), store: store, srv: grpc.NewServer(), calls: map[string]int{}}
	dedupv1.RegisterDedupServer(n.srv, n)
	dedupv1.RegisterAdminServer(n.srv, n)
	go func() { _ = n.srv.Serve(lis) }()
	t.Cleanup(n.srv.Stop)
	return n
}

func (n *fakeNode) count(op string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls[op]
}

// enter counts a call and applies the configured faults. It returns a
// non-nil error when the call must fail before applying, and drop=true when
// the reply must be dropped after applying.
func (n *fakeNode) enter(op string, write bool) (drop bool, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls[op]++
	if !write {
		return false, nil
	}
	if n.failNext > 0 {
		n.failNext--
		return false, status.Error(codes.Unavailable, "fake: no leader")
	}
	if n.dropReplies > 0 {
		n.dropReplies--
		return true, nil
	}
	return false, nil
}

var errReplyLost = status.Error(codes.Unavailable, "fake: leadership lost, outcome unknown")

func (n *fakeNode) Mark(_ context.Context, req *dedupv1.MarkRequest) (*dedupv1.MarkResponse, error) {
	drop, err := n.enter("mark", true)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.tokens = append(n.tokens, req.GetRequestToken())
	n.mu.Unlock()
	if req.GetNamespace() == "missing" {
		return nil, status.Error(codes.NotFound, `namespace "missing" not found`)
	}
	s := n.store
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &dedupv1.MarkResponse{}
	for i, it := range req.GetItems() {
		if len(it.GetId()) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "items[%d].id: empty", i)
		}
	}
	for _, it := range req.GetItems() {
		tok := it.GetRequestToken()
		if len(tok) == 0 {
			tok = req.GetRequestToken()
		}
		key := req.GetNamespace() + "\x00" + string(it.GetId())
		rec, ok := s.records[key]
		switch {
		case !ok:
			rec = &dedupv1.Record{
				State:           dedupv1.RecordState_RECORD_STATE_COMMITTED,
				FirstSeenUnixMs: s.nowMs,
				ExpiresUnixMs:   s.nowMs + req.GetTtlMs(),
				RequestToken:    tok,
				Digest:          it.GetDigest(),
			}
			s.records[key] = rec
			resp.Results = append(resp.Results, &dedupv1.MarkResult{Code: dedupv1.MarkResult_NEW, Record: rec})
		case bytes.Equal(rec.GetRequestToken(), tok):
			resp.Results = append(resp.Results, &dedupv1.MarkResult{Code: dedupv1.MarkResult_NEW, Record: rec})
		case len(it.GetDigest()) > 0 && !bytes.Equal(rec.GetDigest(), it.GetDigest()):
			resp.Results = append(resp.Results, &dedupv1.MarkResult{Code: dedupv1.MarkResult_CONFLICT, Record: rec})
		default:
			resp.Results = append(resp.Results, &dedupv1.MarkResult{Code: dedupv1.MarkResult_DUPLICATE, Record: rec})
		}
	}
	if drop {
		return nil, errReplyLost
	}
	return resp, nil
}

func (n *fakeNode) Check(_ context.Context, req *dedupv1.CheckRequest) (*dedupv1.CheckResponse, error) {
	if _, err := n.enter("check", false); err != nil {
		return nil, err
	}
	s := n.store
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &dedupv1.CheckResponse{}
	for _, id := range req.GetIds() {
		if rec, ok := s.records[req.GetNamespace()+"\x00"+string(id)]; ok {
			resp.Results = append(resp.Results, &dedupv1.CheckResult{Code: dedupv1.CheckResult_SEEN, Record: rec})
		} else {
			resp.Results = append(resp.Results, &dedupv1.CheckResult{Code: dedupv1.CheckResult_NOT_SEEN})
		}
	}
	return resp, nil
}

func (n *fakeNode) Commit(_ context.Context, req *dedupv1.CommitRequest) (*dedupv1.LeaseResponse, error) {
	if _, err := n.enter("commit", true); err != nil {
		return nil, err
	}
	resp := &dedupv1.LeaseResponse{}
	for _, it := range req.GetItems() {
		code := dedupv1.LeaseResult_OK
		if it.GetFencingToken() != 7 {
			code = dedupv1.LeaseResult_LEASE_LOST
		}
		resp.Results = append(resp.Results, &dedupv1.LeaseResult{Code: code})
	}
	return resp, nil
}

func (n *fakeNode) Forget(_ context.Context, req *dedupv1.ForgetRequest) (*dedupv1.ForgetResponse, error) {
	if _, err := n.enter("forget", true); err != nil {
		return nil, err
	}
	// A buggy server: one result short.
	return &dedupv1.ForgetResponse{Results: make([]*dedupv1.ForgetResult, max(len(req.GetIds())-1, 0))}, nil
}

func (n *fakeNode) Status(context.Context, *dedupv1.StatusRequest) (*dedupv1.StatusResponse, error) {
	n.enter("status", false)
	s := n.store
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &dedupv1.StatusResponse{NodeId: n.id, State: "follower", Term: 3}
	if s.leader != nil {
		resp.LeaderId = s.leader.id
		resp.LeaderGrpcAddr = s.leader.addr
		if s.leader == n {
			resp.State = "leader"
		}
	}
	resp.Members = append(resp.Members, &dedupv1.Member{Id: n.id, GrpcAddr: n.addr, Suffrage: "voter", Leader: s.leader == n})
	return resp, nil
}

func (n *fakeNode) CreateNamespace(_ context.Context, req *dedupv1.CreateNamespaceRequest) (*dedupv1.NamespaceResponse, error) {
	n.enter("create", true)
	ns := req.GetNamespace()
	ns.BucketWidthMs = 60_000
	if ns.GetExpiryMode() == dedupv1.ExpiryMode_EXPIRY_MODE_UNSPECIFIED {
		ns.ExpiryMode = dedupv1.ExpiryMode_EXPIRY_MODE_FIXED
	}
	return &dedupv1.NamespaceResponse{Namespace: ns}, nil
}
