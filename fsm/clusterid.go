package fsm

import (
	"errors"
	"fmt"

	"github.com/dedupnode/dedupnode/storage"
)

// ClusterIDSetting is the cluster setting (OpSetSetting) that holds the
// cluster ID: the random identity a cluster gets once, through its log
// (cluster.NewClusterID, proposed by the first leader that finds none), and
// that every node reports to clients and peers so neither talks to another
// cluster by mistake.
//
// It travels as a setting, not as an op kind of its own, because the
// leader of a new version assigns it to a cluster written by an older one
// during a rolling upgrade: older followers decode OpSetSetting and store
// it like any setting, where an unknown op kind would be skipped there and
// applied here, and the replicas' states would differ. Snapshots, backups
// and digests carry it like every key.
const ClusterIDSetting = "cluster-id"

// MaxClusterIDBytes bounds a cluster ID (cluster.NewClusterID makes 32 hex
// characters).
const MaxClusterIDBytes = 64

// ErrClusterIDSet is an OpSetSetting of ClusterIDSetting refused because
// the state already holds another cluster ID: the ID is set once, and no
// entry changes or removes it.
var ErrClusterIDSet = errors.New("cluster ID already set")

// applyClusterID applies an OpSetSetting of ClusterIDSetting: set once,
// never changed nor removed. Repeating the recorded value is harmless.
// Older versions apply it as a plain setting; they agree as long as no
// entry carries a second value, and none does: only a leader that found
// no ID proposes one, after its term barrier, and Node.SetSetting refuses
// the name.
func (a *applier) applyClusterID(s Setting) OpResult {
	st := &a.f.st
	cur, ok := st.settings[ClusterIDSetting]
	switch {
	case s.Unset:
		return OpResult{Err: invalid("setting.unset", "the cluster ID is never removed")}
	case s.Value == "" || len(s.Value) > MaxClusterIDBytes:
		return OpResult{Err: invalid("setting.value", "cluster ID must be 1..%d bytes", MaxClusterIDBytes)}
	case ok && cur == s.Value:
		return OpResult{}
	case ok:
		return OpResult{Err: fmt.Errorf("%w: %s (asked to set %s)", ErrClusterIDSet, cur, s.Value)}
	}
	st.settings[ClusterIDSetting] = s.Value
	must(a.b.Set(storage.SettingKey(ClusterIDSetting), []byte(s.Value), nil))
	a.f.setClusterID(s.Value)
	return OpResult{}
}

// ClusterID returns the cluster ID the applied state holds, "" until the
// entry that set it has applied (a cluster of an older version, a node
// still catching up). It takes no lock.
func (f *FSM) ClusterID() string {
	if p := f.clusterID.Load(); p != nil {
		return *p
	}
	return ""
}

func (f *FSM) setClusterID(id string) { f.clusterID.Store(&id) }
