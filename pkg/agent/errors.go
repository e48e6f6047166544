package agent

import (
	"errors"
	"fmt"
	"net/http"
)

// Error codes carried in ErrorBody.Code. They are part of the protocol:
// never renamed, only added.
const (
	CodeBadRequest        = "bad_request"
	CodeNotFound          = "not_found"
	CodePermissionDenied  = "permission_denied"
	CodeMemberUnreachable = "member_unreachable"
	CodeConflict          = "conflict"
	CodeInvalidConfig     = "invalid_config"
	CodeUnavailable       = "unavailable"
	CodeInternal          = "internal"
)

// Error is an error reported by the agent (or produced by a Backend for the
// agent to report). Client methods return *Error for every non-2xx answer;
// use errors.As to get at it, or errors.Is with the sentinels below.
type Error struct {
	Status  int    // HTTP status
	Code    string // one of the Code constants
	Message string // human readable; names the group/member/file at fault
}

func (e *Error) Error() string { return e.Message }

// Is matches sentinels by Code, so errors.Is(err, ErrNotFound) holds for any
// not-found error whatever its message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	return t.Message == "" && t.Code == e.Code
}

// Sentinels for errors.Is; they match any *Error with the same code.
var (
	ErrBadRequest        = &Error{Code: CodeBadRequest}
	ErrNotFound          = &Error{Code: CodeNotFound}
	ErrPermissionDenied  = &Error{Code: CodePermissionDenied}
	ErrMemberUnreachable = &Error{Code: CodeMemberUnreachable}
	ErrConflict          = &Error{Code: CodeConflict}
	ErrInvalidConfig     = &Error{Code: CodeInvalidConfig}
	ErrUnavailable       = &Error{Code: CodeUnavailable}
)

// statusOf gives the HTTP status for a code.
func statusOf(code string) int {
	switch code {
	case CodeBadRequest:
		return http.StatusBadRequest
	case CodeNotFound:
		return http.StatusNotFound
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeConflict:
		return http.StatusConflict
	case CodeInvalidConfig:
		return http.StatusUnprocessableEntity
	case CodeMemberUnreachable:
		return http.StatusBadGateway
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// Errorf returns an *Error with the given code, for Backends to return.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Status: statusOf(code), Code: code, Message: fmt.Sprintf(format, args...)}
}

// UnreachableError is returned by Client methods when the socket cannot be
// dialled: the agent is not running, or the socket path is wrong.
type UnreachableError struct {
	Path string
	Err  error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach haagent at %s: is it running? (%v)", e.Path, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// SocketPermissionError is returned when the kernel refuses the connection
// because the socket file's mode does not admit the caller.
type SocketPermissionError struct {
	Path string
	Err  error
}

func (e *SocketPermissionError) Error() string {
	return fmt.Sprintf("permission denied connecting to haagent at %s: the socket admits root, the agent's user and allowed_group (%v)", e.Path, e.Err)
}

func (e *SocketPermissionError) Unwrap() error { return e.Err }

// Is makes a socket permission error match ErrPermissionDenied.
func (e *SocketPermissionError) Is(target error) bool { return target == ErrPermissionDenied }

// VersionError is returned when the agent speaks another protocol version.
type VersionError struct {
	Client, Server string
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("haagent speaks API version %q, this hactl speaks %q: upgrade the older one", e.Server, e.Client)
}

// IsUnreachable reports whether err means no agent answered on the socket.
func IsUnreachable(err error) bool {
	var u *UnreachableError
	return errors.As(err, &u)
}
