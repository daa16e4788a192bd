package longtest

import "testing"

func TestPickAndNeedFollowTheEnvironment(t *testing.T) {
	t.Setenv(Env, "")
	if Enabled() || Pick(1, 2) != 1 {
		t.Fatalf("%s unset: Enabled %v, Pick %d; want the short variant", Env, Enabled(), Pick(1, 2))
	}
	t.Run("skipped", func(t *testing.T) {
		Need(t)
		t.Fatal("Need did not skip without the variable")
	})
	t.Setenv(Env, "yes")
	if Enabled() {
		t.Fatalf("%s=yes enables the long variants; only 1 does", Env)
	}
	t.Setenv(Env, "1")
	if !Enabled() || Pick(1, 2) != 2 {
		t.Fatalf("%s=1: Enabled %v, Pick %d; want the long variant", Env, Enabled(), Pick(1, 2))
	}
	t.Run("runs", func(t *testing.T) { Need(t) })
}
