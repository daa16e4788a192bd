package cluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/internal/atomicfile"
)

// NodeIDFile is the file in a data dir that records the ID of the node it
// belongs to, written (atomically, fsynced) at the node's first start.
const NodeIDFile = "node-id"

// NodeIDMismatchError: the data dir belongs to another node. Raft state
// does not say which server it is (the configuration lists every member),
// so a node started with another member's data dir would run as a member
// nobody sends anything to. It refuses to start instead.
type NodeIDMismatchError struct {
	DataDir  string
	Recorded string // the ID the data dir belongs to
	Given    string // the ID the node was started with
	// Evidence says where Recorded comes from: "recorded at first start",
	// or, for a data dir of a version before NodeIDFile, what the Raft
	// configuration in it says.
	Evidence string
}

func (e *NodeIDMismatchError) Error() string {
	return fmt.Sprintf("data dir %s belongs to node %q (%s), not %q: start it with --node-id %s, or use an empty --data-dir for a new node",
		e.DataDir, e.Recorded, e.Evidence, e.Given, e.Recorded)
}

// RecordedNodeID returns the node ID recorded in dataDir's NodeIDFile, ""
// when there is none (a new data dir, or one of a version before it).
func RecordedNodeID(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, NodeIDFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read node ID: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("%s is empty: write the ID of the node this data dir belongs to in it", filepath.Join(dataDir, NodeIDFile))
	}
	return id, nil
}

// checkNodeID refuses a data dir recorded as another node's. recorded is
// the ID found ("" when none); legacy is true when there is none but the
// dir holds state of an earlier start.
func checkNodeID(dataDir, id string) (recorded string, legacy bool, err error) {
	if recorded, err = RecordedNodeID(dataDir); err != nil {
		return "", false, err
	}
	if recorded != "" && recorded != id {
		return recorded, false, &NodeIDMismatchError{DataDir: dataDir, Recorded: recorded, Given: id, Evidence: "recorded at first start"}
	}
	if recorded == "" {
		ls, lerr := DetectLogStore(dataDir)
		_, ferr := os.Stat(filepath.Join(dataDir, "fsm"))
		legacy = lerr != nil || ls != "" || ferr == nil
	}
	return recorded, legacy, nil
}

// recordNodeID writes id to dataDir's NodeIDFile atomically, so a crash
// leaves either no file or the whole ID.
func recordNodeID(dataDir, id string) error {
	if err := atomicfile.Write(filepath.Join(dataDir, NodeIDFile), []byte(id+"\n"), 0o644); err != nil {
		return fmt.Errorf("record node ID: %w", err)
	}
	return nil
}

// adoptNodeID records this node's ID in a data dir of a version before
// NodeIDFile, after Raft has read its latest configuration. It refuses
// (*NodeIDMismatchError) when that configuration does not list this ID
// but lists another at this node's Raft address: the data dir is that
// node's, and recording the wrong ID would lock the mistake in.
func (n *Node) adoptNodeID(conf raft.Configuration) error {
	self, other := false, ""
	for _, s := range conf.Servers {
		self = self || string(s.ID) == n.cfg.NodeID
		if string(s.Address) == n.RaftAddr() && string(s.ID) != n.cfg.NodeID {
			other = string(s.ID)
		}
	}
	if !self && other != "" {
		return &NodeIDMismatchError{DataDir: n.cfg.DataDir, Recorded: other, Given: n.cfg.NodeID,
			Evidence: fmt.Sprintf("its Raft configuration lists %q at this node's Raft address %s and no %q", other, n.RaftAddr(), n.cfg.NodeID)}
	}
	if err := recordNodeID(n.cfg.DataDir, n.cfg.NodeID); err != nil {
		return err
	}
	n.log.Info("data dir of an earlier version: adopted the node ID it is started with and recorded it; from now on the data dir starts only with this ID",
		"data_dir", n.cfg.DataDir, "node_id", n.cfg.NodeID, "file", filepath.Join(n.cfg.DataDir, NodeIDFile))
	return nil
}

// RaftAddrChangedError: the latest Raft configuration in the data dir lists
// this node at another address than the one it now advertises. The other
// members dial the recorded address, so unless it reaches this node, the
// node hears from no leader and stands for election again and again
// ("Election timeout reached") without being elected.
type RaftAddrChangedError struct {
	DataDir    string
	NodeID     string
	Recorded   string // the address the configuration lists
	Advertised string // the address this node advertises now
	GRPCAddr   string // this node's client address (for the join command)
}

func (e *RaftAddrChangedError) Error() string {
	return fmt.Sprintf("the cluster's Raft configuration (in %s) records node %s at %s, but it now advertises %s: the other members keep dialing %s and this node will hear from no leader (it logs election timeouts); "+
		"start it with --raft-addr %s (or --raft-advertise %s), or keep the new address by recording it through a member while a majority of voters is up: "+
		"dedupnode join --node-id %s --raft-addr %s --grpc-addr %s --addr MEMBER (docs/OPERATIONS.md, Changing a node's Raft address)",
		e.DataDir, e.NodeID, e.Recorded, e.Advertised, e.Recorded, e.Recorded, e.Recorded, e.NodeID, e.Advertised, e.GRPCAddr)
}

// checkRaftAddr compares this node's advertised Raft address with the one
// the latest configuration records for its ID (nothing when it lists none).
func (n *Node) checkRaftAddr(conf raft.Configuration) *RaftAddrChangedError {
	for _, s := range conf.Servers {
		if string(s.ID) == n.cfg.NodeID && string(s.Address) != n.RaftAddr() {
			return &RaftAddrChangedError{DataDir: n.cfg.DataDir, NodeID: n.cfg.NodeID, Recorded: string(s.Address), Advertised: n.RaftAddr(), GRPCAddr: n.cfg.GRPCAddr}
		}
	}
	return nil
}
