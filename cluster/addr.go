package cluster

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
)

// CheckHostPort says whether addr is a member address the others can dial
// (a Raft or gRPC address recorded in the configuration or the node
// table): HOST:PORT with a host name or IP (IPv6 in brackets) and a port
// number from 1 to 65535. Names are not resolved: that is the dialer's to
// judge, and a name may resolve later. Join and SeedFromBackup check their
// addresses with it, and the CLI its --raft-addr and --grpc-addr flags.
func CheckHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: want HOST:PORT, e.g. 10.0.0.4:7000", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port %q: want a number from 1 to 65535", addr, port)
	}
	if host == "" {
		return fmt.Errorf("%q: no host: want HOST:PORT, e.g. 10.0.0.4%s", addr, addr)
	}
	if _, err := netip.ParseAddr(host); err == nil { // IPv6 zones too
		return nil
	}
	if len(host) > 253 {
		return fmt.Errorf("%q: host name longer than 253 bytes", addr)
	}
	for _, c := range host {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return fmt.Errorf("%q: host %q is neither an IP address nor a host name (letters, digits, '-', '.', '_')", addr, host)
		}
	}
	return nil
}
