package client

import (
	"crypto/sha256"
	"encoding/hex"
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
