package core

// Every core the package's tests make checks its cached figures (checkArmedMin).
func init() { checkArmedMin = true }
