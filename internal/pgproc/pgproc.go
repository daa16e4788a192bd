// Package pgproc starts a private PostgreSQL server (Debian's
// postgresql-15 package) for tests: initdb in a fresh temporary
// directory, the server on a loopback port from the OS with trust
// authentication, stopped by its PID and its directory removed. As root it
// runs as the postgres user, since PostgreSQL refuses to run as root.
package pgproc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// BinDir is where Debian's postgresql-15 package installs the server.
const BinDir = "/usr/lib/postgresql/15/bin"

// ErrNotInstalled means no PostgreSQL server binaries were found.
var ErrNotInstalled = errors.New("PostgreSQL 15 is not installed in " + BinDir + " (Debian: apt-get install postgresql-15)")

// Installed reports whether the server binaries are there.
func Installed() error {
	for _, b := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(BinDir, b)); err != nil {
			return ErrNotInstalled
		}
	}
	return nil
}

// Server is a running PostgreSQL.
type Server struct {
	dir     string
	port    int
	cmd     *exec.Cmd
	exited  chan struct{}
	logPath string
}

// Start runs initdb and the server, and waits until it accepts queries.
func Start(ctx context.Context) (_ *Server, err error) {
	if err := Installed(); err != nil {
		return nil, err
	}
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgproc: running as root and no postgres user to run the server as: %w", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
	}
	// Our own top directory (not a test's 0700 TempDir, which the postgres
	// user could not enter).
	dir, err := os.MkdirTemp("", "dedupnode-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgproc: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		return nil, fmt.Errorf("pgproc: %w", err)
	}
	cred := func(cmd *exec.Cmd) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if uid >= 0 {
			cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		}
	}
	if uid >= 0 {
		for _, d := range []string{dir, data} {
			if err := os.Chown(d, uid, gid); err != nil {
				return nil, fmt.Errorf("pgproc: %w", err)
			}
		}
	}
	initdb := exec.CommandContext(ctx, filepath.Join(BinDir, "initdb"), "-D", data, "--auth=trust",
		"--username=postgres", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	cred(initdb)
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgproc: initdb: %w: %s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pgproc: free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	s := &Server{dir: dir, port: port, exited: make(chan struct{}), logPath: filepath.Join(dir, "postgres.log")}
	logf, err := os.Create(s.logPath)
	if err != nil {
		return nil, fmt.Errorf("pgproc: %w", err)
	}
	// Test settings: no fsync (the data is thrown away), few connections.
	cmd := exec.Command(filepath.Join(BinDir, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=50", "-c", "shared_buffers=32MB", "-c", "logging_collector=off")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cred(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("pgproc: start postgres: %w", err)
	}
	s.cmd = cmd
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(s.exited)
	}()

	db, err := sql.Open("pgx", s.DSN())
	if err != nil {
		s.Close()
		return nil, err
	}
	defer db.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = db.PingContext(pctx)
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			b, _ := os.ReadFile(s.logPath)
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgproc: postgres exited during start: %s", b)
		case <-ctx.Done():
			s.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, fmt.Errorf("pgproc: postgres not ready after 60 s: %w", err)
		}
	}
}

// DSN is a pgx connection string for the postgres database as the
// postgres superuser.
func (s *Server) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// PID is the postmaster's process ID.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Close stops the server by its PID (SIGINT: fast shutdown; SIGKILL to its
// process group after 15 s) and removes its directory.
func (s *Server) Close() {
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exited:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
	}
	os.RemoveAll(s.dir)
}
