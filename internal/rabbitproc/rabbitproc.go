// Package rabbitproc starts a private RabbitMQ broker (the Debian
// rabbitmq-server package, or any install with the same scripts) for
// tests and the demo: its own node name, data, log and Erlang port mapper
// in a directory, AMQP, distribution and port mapper listening on ports
// from the OS on loopback only, stopped by its PID. The system's RabbitMQ service, if any, is left
// alone.
package rabbitproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupnode/dedupnode/internal/logtail"
)

// ErrNotInstalled means no rabbitmq-server was found.
var ErrNotInstalled = errors.New("rabbitmq-server is not installed (Debian/Ubuntu: apt-get install rabbitmq-server)")

// RequireEnv names the environment variable that, set to 1, makes a
// missing broker fail the tests instead of skipping them (CI sets it).
const RequireEnv = "DEDUPNODE_REQUIRE_BROKERS"

// libBin is where Debian's package keeps the scripts that run the broker
// as the calling user; /usr/sbin/rabbitmq-server is a wrapper that
// switches to the rabbitmq user, who could not write our directory.
const libBin = "/usr/lib/rabbitmq/bin"

// Find returns the rabbitmq-server script to run: Debian's
// /usr/lib/rabbitmq/bin/rabbitmq-server, else one on PATH.
func Find() (string, error) {
	p := filepath.Join(libBin, "rabbitmq-server")
	if st, err := os.Stat(p); err == nil && !st.IsDir() {
		return p, nil
	}
	if p, err := exec.LookPath("rabbitmq-server"); err == nil {
		return p, nil
	}
	return "", ErrNotInstalled
}

// Config configures Start.
type Config struct {
	// Dir holds the broker's data, logs and Erlang cookie. Required.
	Dir string
	// ConsumerTimeout, when positive, is the broker's consumer_timeout:
	// a channel holding a delivery unacknowledged for longer is closed
	// (PRECONDITION_FAILED) and its deliveries requeued. Default: the
	// broker's (30 min).
	ConsumerTimeout time.Duration
	// TickInterval is how often channels check the consumer timeout
	// (RabbitMQ's channel_tick_interval, 60 s by default); defaults to a
	// fifth of ConsumerTimeout when that is set.
	TickInterval time.Duration
	// StartTimeout bounds the start (default 90 s; the broker needs 5 to
	// 10 s on two cores).
	StartTimeout time.Duration
}

// Server is a running broker.
type Server struct {
	dir     string
	script  string
	env     []string
	node    string
	port    int
	cmd     *exec.Cmd
	epmd    *exec.Cmd
	exited  chan struct{}
	exitErr error
	logPath string
}

// Start starts a broker and waits until it accepts AMQP connections.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	script, err := Find()
	if err != nil {
		return nil, err
	}
	if cfg.Dir == "" {
		return nil, errors.New("rabbitproc: Dir is required")
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 90 * time.Second
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("rabbitproc: %w", err)
		}
	}
	// No plugins (the management UI would add seconds to the start), no
	// system-wide rabbitmq-env.conf.
	files := map[string]string{"enabled_plugins": "[].\n", "rabbitmq-env.conf": ""}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return nil, fmt.Errorf("rabbitproc: %w", err)
		}
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, fmt.Errorf("rabbitproc: free ports: %w", err)
	}
	amqpPort, distPort, epmdPort := ports[0], ports[1], ports[2]
	s := &Server{dir: dir, port: amqpPort, exited: make(chan struct{}), logPath: filepath.Join(dir, "rabbitmq.log")}

	// Our own Erlang port mapper on a port of ours, stopped with the
	// broker: the node would otherwise start a shared daemon on 4369 that
	// outlives it.
	epmdBin, err := exec.LookPath("epmd")
	if err != nil {
		epmdBin = filepath.Join(filepath.Dir(script), "epmd") // unlikely; fails clearly below
	}
	s.epmd = exec.Command(epmdBin, "-port", strconv.Itoa(epmdPort), "-address", "127.0.0.1")
	s.epmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.epmd.Start(); err != nil {
		return nil, fmt.Errorf("rabbitproc: start epmd: %w", err)
	}

	logf, err := os.Create(s.logPath)
	if err != nil {
		s.stopEPMD()
		return nil, fmt.Errorf("rabbitproc: %w", err)
	}
	// The distribution listener (how rabbitmqctl reaches the node) binds
	// every interface unless told otherwise: RABBITMQ_DIST_PORT fixes its
	// port, not its address.
	loopbackDist := "-kernel inet_dist_use_interface {127,0,0,1}"
	erlArgs := []string{"-noinput", loopbackDist}
	if cfg.ConsumerTimeout > 0 {
		tick := cfg.TickInterval
		if tick <= 0 {
			tick = max(cfg.ConsumerTimeout/5, 100*time.Millisecond)
		}
		erlArgs = append(erlArgs,
			"-rabbit", "consumer_timeout", strconv.FormatInt(cfg.ConsumerTimeout.Milliseconds(), 10),
			"-rabbit", "channel_tick_interval", strconv.FormatInt(tick.Milliseconds(), 10))
	}
	node := fmt.Sprintf("dedupnode-%d-%d@localhost", os.Getpid(), amqpPort)
	cmd := exec.Command(script)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	s.script, s.node = script, node
	cmd.Env = append(os.Environ(),
		"HOME="+dir, // the Erlang cookie goes here
		"ERL_EPMD_PORT="+strconv.Itoa(epmdPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_NODENAME="+node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(amqpPort),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_LOGS=-",
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		// Exec the VM in place of the script, so that our PID is the
		// broker's: SIGTERM stops it cleanly and it dies with us.
		"RABBITMQ_ALLOW_INPUT=1",
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+strings.Join(erlArgs, " "),
		// rabbitmqctl (QueueCounts) is a distribution node of its own
		// while it runs.
		"RABBITMQ_CTL_ERL_ARGS="+loopbackDist,
	)
	s.env = cmd.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		s.stopEPMD()
		return nil, fmt.Errorf("rabbitproc: start %s: %w", script, err)
	}
	s.cmd = cmd
	go func() {
		s.exitErr = cmd.Wait()
		logf.Close()
		close(s.exited)
	}()

	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	for {
		conn, err := amqp.DialConfig(s.URL(), amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err == nil {
			conn.Close()
			return s, nil
		}
		select {
		case <-s.exited:
			s.stopEPMD()
			return nil, fmt.Errorf("rabbitproc: broker exited during start (%v); log %s:\n%s", s.exitErr, s.logPath, logtail.Read(s.logPath, 4000))
		case <-ctx.Done():
			s.Close()
			return nil, fmt.Errorf("rabbitproc: broker not accepting AMQP after %v (%w): %v; log %s:\n%s", cfg.StartTimeout, ctx.Err(), err, s.logPath, logtail.Read(s.logPath, 4000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// URL is the broker's AMQP URL (user guest, which RabbitMQ admits from
// loopback only).
func (s *Server) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", s.port) }

// PID is the broker's (the Erlang VM's) process ID.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// LogPath is where the broker's log is written.
func (s *Server) LogPath() string { return s.logPath }

// QueueCounts returns the numbers of ready and of unacknowledged
// messages in queue (of the default virtual host), as rabbitmqctl
// list_queues reports them: AMQP itself only tells the ready ones. It runs
// rabbitmqctl (an Erlang VM of its own: a second or more), so it suits a
// final check, not a polling loop.
func (s *Server) QueueCounts(ctx context.Context, queue string) (ready, unacked int, err error) {
	cmd := exec.CommandContext(ctx, filepath.Join(filepath.Dir(s.script), "rabbitmqctl"),
		"-n", s.node, "-q", "list_queues", "--no-table-headers", "name", "messages_ready", "messages_unacknowledged")
	cmd.Env = s.env
	cmd.Dir = s.dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return 0, 0, fmt.Errorf("rabbitmqctl list_queues: %w: %s", err, ee.Stderr)
		}
		return 0, 0, fmt.Errorf("rabbitmqctl list_queues: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != queue {
			continue
		}
		r, err1 := strconv.Atoi(f[1])
		u, err2 := strconv.Atoi(f[2])
		if err := errors.Join(err1, err2); err != nil {
			return 0, 0, fmt.Errorf("rabbitmqctl list_queues: line %q: %w", line, err)
		}
		return r, u, nil
	}
	return 0, 0, fmt.Errorf("rabbitmqctl list_queues: no queue %q in %q", queue, out)
}

// Close stops the broker by its PID: SIGTERM (a clean shutdown), SIGKILL to
// its process group after 30 s; then its port mapper.
func (s *Server) Close() error {
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			// The VM and its helpers (erl_child_setup, inet_gethost).
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
	}
	s.stopEPMD()
	return nil
}

func (s *Server) stopEPMD() {
	if s.epmd == nil || s.epmd.Process == nil {
		return
	}
	_ = s.epmd.Process.Kill()
	_ = s.epmd.Wait()
}

// freePorts returns n distinct free loopback TCP ports from the OS. They
// are free when returned; the broker binds them moments later.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
