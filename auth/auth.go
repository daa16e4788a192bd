// Package auth is dedupnode's access control: bearer tokens read from a
// JSON token file (reloadable, e.g. on SIGHUP), each granting rights (read,
// write, admin) on a set of namespaces, and gRPC interceptors that check
// every call against a table mapping each RPC to the right it needs.
//
// # Token file
//
//	{
//	  "tokens": [
//	    {"name": "orders-consumer", "token": "s3cret-1", "namespaces": ["orders"], "rights": ["read", "write"]},
//	    {"name": "dashboards", "token_sha256": "9f86d0…", "namespaces": ["*"], "rights": ["read"]},
//	    {"name": "ops", "token": "s3cret-2", "namespaces": ["*"], "rights": ["read", "write", "admin"]},
//	    {"name": "nodes", "token": "s3cret-3", "rights": ["node"]}
//	  ]
//	}
//
// A token is given either in clear ("token") or as the lower-case hex
// SHA-256 of the token ("token_sha256", so the file need not hold
// secrets). Namespaces are exact names, "*" (all), or a prefix ending in
// "*" ("orders-*"); the namespace "" in a request means "default". Rights
// do not imply each other: a token that may write but not read cannot
// Check. Unknown keys, unknown rights, duplicate names or tokens and empty
// tokens are errors naming the entry.
//
// The "node" right is for nodes only: it allows every call, including the
// Internal service and calls a follower forwards to the leader on a
// client's behalf (the follower has already checked the client). Nodes send
// the first token holding it (Store.NodeToken). Under TLS a node may
// instead be recognised by its node certificate (see Authorizer), and then
// the token file needs no node token.
//
// # Calls
//
// Clients send "authorization: Bearer <token>" metadata. A call without a
// token, or with a token the file does not list, fails with
// Unauthenticated; a known token without the right for the method and
// namespace fails with PermissionDenied. Health checks and reflection need
// no token. A method missing from the table is refused (fail closed).
package auth

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
)

// Right is one permission a token may hold.
type Right uint8

// Rights. They do not imply each other.
const (
	Read  Right = 1 << iota // Check, DescribeNamespace, ListNamespaces (Status: any right)
	Write                   // Mark, Claim, Commit, Renew, Release, Forget
	Admin                   // namespace create/update/delete, Export; on "*": Join, Remove, TransferLeadership, Promote, Backup
	Node                    // everything, including the Internal service (nodes only)
)

var rightNames = []struct {
	r    Right
	name string
}{{Read, "read"}, {Write, "write"}, {Admin, "admin"}, {Node, "node"}}

// String is the right's name as written in the token file.
func (r Right) String() string {
	var parts []string
	for _, rn := range rightNames {
		if r&rn.r != 0 {
			parts = append(parts, rn.name)
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "+")
}

// ParseRight parses one right name (read, write, admin, node).
func ParseRight(s string) (Right, error) {
	for _, rn := range rightNames {
		if s == rn.name {
			return rn.r, nil
		}
	}
	return 0, fmt.Errorf("unknown right %q (want read, write, admin or node)", s)
}

// DefaultNamespace is what an empty namespace in a request means.
const DefaultNamespace = "default"

// Principal is the authenticated caller of one request.
type Principal struct {
	// Name is the token's name from the file, or "node:<CN>" for a node
	// recognised by its certificate. Never the token itself.
	Name       string
	rights     Right
	namespaces []string
}

// NodePrincipal returns a principal holding the node right.
func NodePrincipal(name string) *Principal {
	return &Principal{Name: name, rights: Node, namespaces: []string{"*"}}
}

// IsNode reports whether p holds the node right.
func (p *Principal) IsNode() bool { return p != nil && p.rights&Node != 0 }

// Allowed reports whether p holds right r on namespace ns ("" means
// DefaultNamespace). The node right allows everything.
func (p *Principal) Allowed(r Right, ns string) bool {
	if p == nil {
		return false
	}
	if p.rights&Node != 0 {
		return true
	}
	if p.rights&r == 0 {
		return false
	}
	if ns == "" {
		ns = DefaultNamespace
	}
	for _, pat := range p.namespaces {
		if matchNamespace(pat, ns) {
			return true
		}
	}
	return false
}

// AllowedAny reports whether p holds right r on at least one namespace.
func (p *Principal) AllowedAny(r Right) bool {
	return p != nil && (p.rights&Node != 0 || (p.rights&r != 0 && len(p.namespaces) > 0))
}

// AllowedAll reports whether p holds right r on every namespace ("*").
func (p *Principal) AllowedAll(r Right) bool {
	return p != nil && (p.rights&Node != 0 || (p.rights&r != 0 && slices.Contains(p.namespaces, "*")))
}

func matchNamespace(pat, ns string) bool {
	if pat == "*" || pat == ns {
		return true
	}
	if prefix, ok := strings.CutSuffix(pat, "*"); ok {
		return strings.HasPrefix(ns, prefix)
	}
	return false
}

// fileEntry is one token in the token file.
type fileEntry struct {
	Name        string   `json:"name"`
	Token       string   `json:"token,omitempty"`
	TokenSHA256 string   `json:"token_sha256,omitempty"`
	Namespaces  []string `json:"namespaces,omitempty"`
	Rights      []string `json:"rights"`
}

type fileFormat struct {
	Tokens []fileEntry `json:"tokens"`
}

// table is one loaded version of the token file.
type table struct {
	byDigest  map[[sha256.Size]byte]*Principal
	nodeToken string
}

// Parse reads a token file (see the package doc) from r.
func parse(r io.Reader) (*table, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f fileFormat
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	if dec.More() {
		return nil, errors.New("token file: trailing data after the JSON object")
	}
	t := &table{byDigest: map[[sha256.Size]byte]*Principal{}}
	names := map[string]bool{}
	for i, e := range f.Tokens {
		where := fmt.Sprintf("token file: tokens[%d] (%q)", i, e.Name)
		if e.Name == "" {
			return nil, fmt.Errorf("token file: tokens[%d]: name is required", i)
		}
		if names[e.Name] {
			return nil, fmt.Errorf("%s: duplicate name", where)
		}
		names[e.Name] = true
		var digest [sha256.Size]byte
		switch {
		case e.Token != "" && e.TokenSHA256 != "":
			return nil, fmt.Errorf("%s: give token or token_sha256, not both", where)
		case e.Token != "":
			if len(e.Token) < 8 {
				return nil, fmt.Errorf("%s: token shorter than 8 characters", where)
			}
			digest = sha256.Sum256([]byte(e.Token))
		case e.TokenSHA256 != "":
			b, err := hex.DecodeString(e.TokenSHA256)
			if err != nil || len(b) != sha256.Size {
				return nil, fmt.Errorf("%s: token_sha256 must be 64 hex digits", where)
			}
			copy(digest[:], b)
		default:
			return nil, fmt.Errorf("%s: token or token_sha256 is required", where)
		}
		if _, dup := t.byDigest[digest]; dup {
			return nil, fmt.Errorf("%s: the same token is listed twice", where)
		}
		p := &Principal{Name: e.Name}
		if len(e.Rights) == 0 {
			return nil, fmt.Errorf("%s: rights is empty", where)
		}
		for _, rs := range e.Rights {
			r, err := ParseRight(rs)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			p.rights |= r
		}
		for _, ns := range e.Namespaces {
			if ns == "" {
				return nil, fmt.Errorf("%s: empty namespace (write %q for the default namespace)", where, DefaultNamespace)
			}
			p.namespaces = append(p.namespaces, ns)
		}
		if p.rights&Node != 0 {
			p.namespaces = []string{"*"}
			if t.nodeToken == "" && e.Token != "" {
				t.nodeToken = e.Token
			}
		} else if len(p.namespaces) == 0 {
			return nil, fmt.Errorf("%s: namespaces is empty (use [\"*\"] for all)", where)
		}
		t.byDigest[digest] = p
	}
	return t, nil
}

// Store holds the current token table. Safe for concurrent use.
type Store struct {
	path string
	mu   sync.RWMutex
	t    *table
}

// Load reads the token file at path.
func Load(path string) (*Store, error) {
	s := &Store{path: path}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Parse builds a Store from a token file's content (no file to reload).
func Parse(r io.Reader) (*Store, error) {
	t, err := parse(r)
	if err != nil {
		return nil, err
	}
	return &Store{t: t}, nil
}

// Reload re-reads the file. On error the previous table stays in force, so
// a typo in the file never locks everyone out.
func (s *Store) Reload() error {
	if s.path == "" {
		return errors.New("token store has no file to reload")
	}
	f, err := os.Open(s.path)
	if err != nil {
		return fmt.Errorf("open token file: %w", err)
	}
	defer f.Close()
	t, err := parse(f)
	if err != nil {
		return fmt.Errorf("%s: %w", s.path, err)
	}
	s.mu.Lock()
	s.t = t
	s.mu.Unlock()
	return nil
}

// Len returns the number of tokens in force.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.t.byDigest)
}

// NodeToken returns the first clear-text token holding the node right, or
// "" when there is none.
func (s *Store) NodeToken() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.t.nodeToken
}

// Authenticate returns the principal of token, or false when the token is
// not listed. The lookup is by SHA-256 digest of the token, so its time
// tells an attacker nothing about how much of a guess matches a real token.
func (s *Store) Authenticate(token string) (*Principal, bool) {
	if token == "" {
		return nil, false
	}
	d := sha256.Sum256([]byte(token))
	s.mu.RLock()
	p, ok := s.t.byDigest[d]
	s.mu.RUnlock()
	if !ok {
		return nil, false
	}
	return p, true
}
