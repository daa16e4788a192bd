package main

import (
	"context"
	"strings"
	"testing"
)

// Usage errors name what is wrong: the one flag out of range, a fencing
// token that overflows (not "not a positive integer").
func TestUsageErrorsNameWhatIsWrong(t *testing.T) {
	ctx := context.Background()
	addr := closedAddr(t)
	for _, c := range []struct {
		args    []string
		want    []string
		notWant string
	}{
		{[]string{"bench", "--addr", addr, "--concurrency", "0", "--duration", "1s"}, []string{"--concurrency 0", "at least 1"}, "--batch"},
		{[]string{"bench", "--addr", addr, "--id-size", "0", "--duration", "1s"}, []string{"--id-size 0", "at least 1"}, "--concurrency"},
		{[]string{"bench", "--addr", addr, "--batch", "-3", "--duration", "1s"}, []string{"--batch -3", "at least 1"}, "--id-size"},
		{[]string{"commit", "--addr", addr, "job-1=99999999999999999999999"}, []string{"overflows", "18446744073709551615"}, "not a positive integer"},
	} {
		code, _, errb := runCLI(t, ctx, "", c.args...)
		ok := code == exitUsage || code == exitError
		for _, w := range c.want {
			ok = ok && strings.Contains(errb, w)
		}
		if !ok || strings.Contains(errb, c.notWant) {
			t.Errorf("%v: exit %d, stderr %q; want %q, not %q", c.args, code, errb, c.want, c.notWant)
		}
	}
}
