//go:build !linux

package storage

// CanLowerPriority reports whether Options.BackgroundNice takes effect here.
const CanLowerPriority = false

// lowerThreadPriority does nothing: thread priorities are set on Linux
// only.
func lowerThreadPriority(int) {}
