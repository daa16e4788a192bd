// Package security holds dedupnode's transport security: a development
// certificate authority that issues node and client certificates with the
// standard library (the `dedupnode certs` command), tls.Config builders for
// the gRPC server and its clients (with optional mutual TLS), and a TLS
// raft.StreamLayer that mutually authenticates Raft traffic between nodes.
//
// Identity model:
//
//   - The cluster CA (ca.crt) signs every node certificate. Raft connections
//     require both ends to present a certificate that chains to the cluster
//     CA and is a node certificate (IsNodeCertificate: it may act as a TLS
//     server). A node holding a certificate from another CA, or a client
//     certificate from the same CA, cannot open a Raft connection, so it can
//     neither join nor inject log entries.
//   - The gRPC server presents its node certificate. With a client CA set,
//     every gRPC client must present a certificate that chains to it (mutual
//     TLS). Nodes dial each other's gRPC with their node certificate, which
//     is how package auth recognises a fellow node.
//
// Keys are ECDSA P-256; TLS 1.2 is the minimum for gRPC clients (1.3 for
// Raft, which only ever talks to itself).
package security
