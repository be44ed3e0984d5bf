package ipvsnl

// For the external tests (package ipvsnl_test), which share package
// ipvsnltest's helpers with IPVS mode's tests.
var ParseProcIPVS = parseProcIPVS

const MaxWeight = maxWeight
