package dedupv1

import (
	"strings"
	"testing"
)

// Every result name is its enum value's name in lower case, so metrics
// (which lower-case the enum) and the client (which uses the constants)
// spell results alike.
func TestResultNamesAreTheEnumNames(t *testing.T) {
	for name, enum := range map[string]interface{ String() string }{
		ResultNew: MarkResult_NEW, ResultDuplicate: MarkResult_DUPLICATE, ResultConflict: MarkResult_CONFLICT,
		ResultSeen: CheckResult_SEEN, ResultNotSeen: CheckResult_NOT_SEEN,
		ResultAcquired: ClaimResult_ACQUIRED, ResultInProgress: ClaimResult_IN_PROGRESS,
		ResultOK: LeaseResult_OK, ResultLeaseLost: LeaseResult_LEASE_LOST,
	} {
		if got := strings.ToLower(enum.String()); got != name {
			t.Errorf("%s: enum %s lower-cased is %q", name, enum, got)
		}
	}
}
