package sandbox

// SetNewHook makes New call f with each new sandbox's prefix before it
// creates anything, so that a test can check what a failed New left.
func SetNewHook(f func(prefix string)) { newHook = f }
