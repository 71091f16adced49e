// Package configerr makes the errors that refuse a setting: the message
// says what is wrong and names the flag, and the error matches its
// package's sentinel (errors.Is) without printing the sentinel's words,
// which would only say again that the setting is invalid.
package configerr
