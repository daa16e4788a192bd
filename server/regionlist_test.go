package server_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
)

// TestSetClusterSetting_EmptyRegionEntryIsInvalidArgument: Ops.SetClusterSetting
// refuses preferred-leader-regions 'us, eu,,' with INVALID_ARGUMENT naming
// the empty entry (it was stored as us,eu without a word), and stores an
// accepted list trimmed.
func TestSetClusterSetting_EmptyRegionEntryIsInvalidArgument(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 1})
	l := tc.leader()
	ops := dedupv1.NewOpsClient(l.cc)
	_, err := ops.SetClusterSetting(rpcCtx(t), &dedupv1.SetClusterSettingRequest{Name: cluster.SettingPreferredLeaderRegions, Value: "us, eu,,"})
	wantStatus(t, err, codes.InvalidArgument, "entry 3 is empty")
	if got := l.srv.Node().PreferredLeaderRegions(); len(got) != 0 {
		t.Fatalf("refused setting stored %q", got)
	}
	if _, err := ops.SetClusterSetting(rpcCtx(t), &dedupv1.SetClusterSettingRequest{Name: cluster.SettingPreferredLeaderRegions, Value: " us , eu "}); err != nil {
		t.Fatal(err)
	}
	if got := l.srv.Node().FSM().Settings()[cluster.SettingPreferredLeaderRegions]; got != "us,eu" {
		t.Fatalf("stored %q, want us,eu", got)
	}
}
