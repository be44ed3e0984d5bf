package nft

// Text is the rule as `nft list ruleset` prints it in a chain of family f.
func (r Rule) Text(f Family) string { return r.text(f) }
