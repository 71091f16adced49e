// Package logthrottle keeps a condition that persists from flooding the
// log: a line under a key is written at most once per interval, and the
// next one that gets through says how many were held back meanwhile.
// A throttle made with NewFlushing keeps the last line held back under a
// key, and Flush writes it once its interval is over, for conditions that
// change (an engine that left and came back).
//
// # Responsibility
//
// Throttle decides, per key, whether a line may be written now. It is for
// conditions that the code sees again on every poll (a misconfigured
// engine re-registering, a corrupt registry slot), whose first report is
// what an operator needs and whose repetitions only bury other lines.
// What to log and at which level stays with the caller.
//
// # Ownership and concurrency
//
// A Throttle is owned by the component that logs through it; its methods
// are safe for concurrent use (one mutex, taken only on the slow path of
// logging). Keys are forgotten when they have been quiet for a whole
// interval at the next Allow that finds more than maxKeys of them, so a
// throttle never grows without bound.
package logthrottle
