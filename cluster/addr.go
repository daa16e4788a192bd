package cluster

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
)

// CheckHostPort says whether addr is a member address the others can dial
// (a Raft or gRPC address recorded in the configuration or the node
// table): HOST:PORT with a host name or IP (IPv6 in brackets; not an
// unspecified one, 0.0.0.0 or ::) and a port number from 1 to 65535.
// Names are not resolved: that is the dialer's to judge, and a name may
// resolve later. Join and SeedFromBackup check their addresses with it,
// and the CLI every address a node is to be dialed at (join, restore,
// serve --peers and the advertised addresses).
func CheckHostPort(addr string) error {
	host, err := checkHostPort(addr, 1)
	if err != nil {
		return err
	}
	if host == "" {
		return fmt.Errorf("%q: no host: want HOST:PORT, e.g. 10.0.0.4%s", addr, addr)
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
		return fmt.Errorf("%q: %s means every interface of a machine, not an address another one can dial: give one of its addresses", addr, host)
	}
	return nil
}

// CheckListenAddr says whether addr is an address to listen on: as
// CheckHostPort, but port 0 (a free port from the OS) is allowed, and so
// is a host that is empty or an unspecified IP (":7000", "0.0.0.0:7000",
// "[::]:7000"), which listens on every interface: everyInterface reports
// it, since that is no address to advertise.
func CheckListenAddr(addr string) (everyInterface bool, err error) {
	host, err := checkHostPort(addr, 0)
	if err != nil {
		return false, err
	}
	if host == "" {
		return true, nil
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsUnspecified(), nil
}

// checkHostPort checks that addr is HOST:PORT with a port from minPort to
// 65535 and a host that is empty, an IP or a host name, and returns the
// host.
func checkHostPort(addr string, minPort int) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%q: want HOST:PORT, e.g. 10.0.0.4:7000", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < minPort || n > 65535 {
		return "", fmt.Errorf("%q: port %q: want a number from %d to 65535", addr, port, minPort)
	}
	if host == "" {
		return "", nil
	}
	if _, err := netip.ParseAddr(host); err == nil { // IPv6 zones too
		return host, nil
	}
	if len(host) > 253 {
		return "", fmt.Errorf("%q: host name longer than 253 bytes", addr)
	}
	for _, c := range host {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return "", fmt.Errorf("%q: host %q is neither an IP address nor a host name (letters, digits, '-', '.', '_')", addr, host)
		}
	}
	return host, nil
}
