package dedupv1

// The names of item results, in one place: each is its result enum value's
// name in lower case (MarkResult_NEW is "new", CheckResult_NOT_SEEN is
// "not_seen"; results_test.go checks it). The CLI prints them, the client's
// Code spells them, metrics label items with them and chaos histories
// record them.
const (
	ResultNew        = "new"
	ResultDuplicate  = "duplicate"
	ResultConflict   = "conflict"
	ResultSeen       = "seen"
	ResultNotSeen    = "not_seen"
	ResultAcquired   = "acquired"
	ResultInProgress = "in_progress"
	ResultOK         = "ok"
	ResultLeaseLost  = "lease_lost"
)

// CompactInResults is the flag of a compact MarkResponse's code (codes)
// whose item's result is in results rather than built from new_record.
const CompactInResults = 0x80
