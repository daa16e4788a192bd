package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Pointing a client command at an HTTP/1.1 listener (such as the admin
// port dev and serve print) names that mistake, instead of claiming the
// node speaks TLS.
func TestClientAtHTTPPortSaysSo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	code, _, errs := runCLI(t, context.Background(), "", "status", "--addr", addr, "--timeout", "5s")
	if code != exitError || !strings.Contains(errs, "serves HTTP/1.1, not gRPC") || strings.Contains(errs, "speaks TLS") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}
