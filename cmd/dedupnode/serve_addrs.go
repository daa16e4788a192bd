package main

import (
	"net"

	"github.com/dedupnode/dedupnode/cluster"
)

// checkAddrs refuses, as a usage error naming the flag, an address flag of
// serve that could never work, before anything listens:
//   - --raft-addr and --grpc-addr are HOST:PORT to listen on, port 0 for
//     one from the OS (cluster.CheckListenAddr). A host that is empty or
//     unspecified (":7070", "0.0.0.0:7070") listens on every interface,
//     which the other nodes and clients cannot dial: it needs
//     --raft-advertise or --grpc-advertise. (--grpc-addr "" listened on
//     every interface, on a port from the OS, and advertised 127.0.0.1.)
//   - --raft-advertise, --grpc-advertise and the --join addresses are
//     addresses others dial (cluster.CheckHostPort, as join and restore
//     check theirs).
//   - --admin-addr, when given, is HOST:PORT to listen on; every interface
//     is fine (a Prometheus server elsewhere scrapes it), nothing is
//     advertised.
func (f *serveFlags) checkAddrs() error {
	for _, l := range []struct{ flag, addr, advertiseFlag, advertise string }{
		{"--raft-addr", f.raftAddr, "--raft-advertise", f.raftAdvertise},
		{"--grpc-addr", f.grpcAddr, "--grpc-advertise", f.grpcAdvertise},
	} {
		every, err := cluster.CheckListenAddr(l.addr)
		if err != nil {
			return usagef("%s %v", l.flag, err)
		}
		if l.advertise != "" {
			if err := cluster.CheckHostPort(l.advertise); err != nil {
				return usagef("%s %v", l.advertiseFlag, err)
			}
		} else if every {
			return usagef("%s %q listens on every interface, an address no other node or client can dial: give %s HOST:PORT too, the address they dial (this machine's name or IP, or the one a proxy or port mapping forwards from)",
				l.flag, l.addr, l.advertiseFlag)
		}
	}
	if f.adminAddr != "" {
		if _, err := cluster.CheckListenAddr(f.adminAddr); err != nil {
			return usagef("--admin-addr %v", err)
		}
	}
	for _, j := range f.join {
		if err := cluster.CheckHostPort(j); err != nil {
			return usagef("--join %v", err)
		}
	}
	return nil
}

// grpcAdvertised is the client address the node advertises (records in
// the node table, for followers to forward to and clients to be sent
// to): --grpc-advertise, else --grpc-addr; "" when --grpc-addr's port is
// 0, so that the server advertises the port the OS gave.
func (f *serveFlags) grpcAdvertised() string {
	if f.grpcAdvertise != "" {
		return f.grpcAdvertise
	}
	if _, port, _ := net.SplitHostPort(f.grpcAddr); port == "0" {
		return ""
	}
	return f.grpcAddr
}
