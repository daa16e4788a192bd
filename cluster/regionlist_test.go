package cluster

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/fsm"
)

// TestParseRegions: spaces around names are trimmed and repeats dropped;
// an empty entry is refused naming its position (it used to be dropped, so
// 'us, eu,,' was taken as us,eu without a word), as is an invalid name;
// an empty list is no preference.
func TestParseRegions(t *testing.T) {
	for in, want := range map[string][]string{
		"":                   nil,
		"  ":                 nil,
		"us":                 {"us"},
		" us , eu-west ":     {"us", "eu-west"},
		"us,eu,us":           {"us", "eu"},
		"ap_south.1,\tus-e ": {"ap_south.1", "us-e"},
	} {
		got, err := ParseRegions(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseRegions(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"us, eu,,":                      "entry 3 is empty",
		",us":                           "entry 1 is empty",
		"us,":                           "entry 2 is empty",
		"us, ,eu":                       "entry 2 is empty",
		"us,a b":                        `region "a b"`,
		"us,e/u":                        `region "e/u"`,
		"us," + strings.Repeat("r", 65): "longer than 64 bytes",
	} {
		if _, err := ParseRegions(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRegions(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}

// TestSetSetting_RegionListIsCheckedAndStoredTrimmed: the leader refuses a
// preferred-leader-regions list with an empty entry (INVALID_ARGUMENT for
// the value, nothing written) and stores an accepted one trimmed.
func TestSetSetting_RegionListIsCheckedAndStoredTrimmed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := startNode(t, testConfig(t.TempDir(), true))
	before := n.Raft().LastIndex()
	err := n.SetSetting(ctx, SettingPreferredLeaderRegions, "us, eu,,", false)
	var inv *fsm.InvalidError
	if !errors.As(err, &inv) || inv.Field != "value" || !strings.Contains(err.Error(), "entry 3 is empty") {
		t.Fatalf("SetSetting(\"us, eu,,\") = %v, want an invalid value naming entry 3", err)
	}
	if after := n.Raft().LastIndex(); after != before {
		t.Fatalf("refused setting wrote log entries %d..%d", before+1, after)
	}
	if err := n.SetSetting(ctx, SettingPreferredLeaderRegions, " us , eu ", false); err != nil {
		t.Fatal(err)
	}
	if got := n.FSM().Settings()[SettingPreferredLeaderRegions]; got != "us,eu" {
		t.Fatalf("stored %q, want us,eu", got)
	}
}
