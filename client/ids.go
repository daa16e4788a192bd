package client

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// ContentID returns a message ID derived from the body, for producers that
// have no ID of their own: the lower-case hex SHA-256 of body (64 ASCII
// bytes), as SQS FIFO's content-based deduplication. Two messages with the
// same body are duplicates of each other.
func ContentID(body []byte) []byte {
	sum := sha256.Sum256(body)
	out := make([]byte, hex.EncodedLen(len(sum)))
	hex.Encode(out, sum[:])
	return out
}

// Digest returns the payload digest to send in Item.Digest: the raw SHA-256
// of body (32 bytes). An ID seen again with another digest answers
// CodeConflict: a producer reused the ID for different content.
func Digest(body []byte) []byte {
	sum := sha256.Sum256(body)
	return sum[:]
}

// emptyIDViolation is a node's reason for an empty message ID, word for
// word (fsm.Validate, and the server's check of a Check's IDs). The client
// cannot call that validator: it lives in package fsm, with the storage
// engine behind it, which a client must not import.
const emptyIDViolation = "empty message ID"

// The client checks the one rule about IDs that holds on every node and
// for every namespace, an ID is not empty, before it dials or sends
// anything: a request with an empty ID fails with ErrInvalidArgument
// shaped as a node's answer (Field "items[i].id", or "ids[i]" for a list
// of IDs, Item i+1, Violation emptyIDViolation), about the first such ID,
// and nothing of it is sent. Limits a node or namespace sets (the max ID
// length) stay the node's to check.

// validItemIDs checks the IDs of Mark and Claim items.
func validItemIDs(op string, items []Item) error {
	for i := range items {
		if len(items[i].ID) == 0 {
			return emptyID(op, "items[%d].id", i)
		}
	}
	return nil
}

// validLeaseIDs checks the IDs of Commit, Renew and Release leases.
func validLeaseIDs(op string, leases []Lease) error {
	for i := range leases {
		if len(leases[i].ID) == 0 {
			return emptyID(op, "items[%d].id", i)
		}
	}
	// After every ID, as a node checks them.
	for i := range leases {
		if len(leases[i].RequestToken) == 0 {
			return invalidArgument(op, fmt.Sprintf("items[%d].request_token", i), i+1, noLeaseTokenViolation)
		}
	}
	return nil
}

// noLeaseTokenViolation refuses a Lease without its request token, which
// a node refuses alike: the fencing token alone proves nothing (anyone can
// guess it).
const noLeaseTokenViolation = "required: the request token of the claim that granted the lease (Result.Lease of its acquired answer)"

// validIDs checks the IDs of Check and Forget, a plain list ("ids[i]").
func validIDs(op string, ids [][]byte) error {
	for i, id := range ids {
		if len(id) == 0 {
			return emptyID(op, "ids[%d]", i)
		}
	}
	return nil
}

// emptyID refuses the empty ID at index i (from 0) of a request.
func emptyID(op, fieldFormat string, i int) error {
	return invalidArgument(op, fmt.Sprintf(fieldFormat, i), i+1, emptyIDViolation)
}
