package inbox

// SetAfterTxCommit sets the hook run between the transaction commit and
// the dedupnode commit (the crash window), for tests.
func SetAfterTxCommit(ib *Inbox, f func()) { ib.cfg.afterTxCommit = f }
