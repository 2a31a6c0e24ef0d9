package cluster

import (
	"log/slog"
	"net"
	"strconv"
)

// HTTPPortOffset is how far above the remote's port the admin API listens by default
// (7070 → 7080), so several nodes on one machine get distinct addresses.
const HTTPPortOffset = 10

// DefaultHTTP is the default admin API address of a node listening on listen: the
// same host, port + HTTPPortOffset ("" when listen has no usable port).
func DefaultHTTP(listen string) string {
	host, port, err := splitHostPort(listen)
	if err != nil || port == 0 || port+HTTPPortOffset > 65535 {
		return ""
	}
	return net.JoinHostPort(host, strconv.Itoa(port+HTTPPortOffset))
}

// RouteLibraryLogs sends the standard library's log package into log (it becomes
// slog's default logger), so a process prints no line outside slog. proto.actor's
// own logs are routed per actor system (NodeConfig.ActorLogLevel, WARN by default);
// gRPC's, the transport under proto.actor's remote, are discarded by the remote
// itself (it installs a discarding grpclog logger whenever one starts).
//
// It sets a process-wide logger: call it once, from main. Libraries and tests should
// not call it.
func RouteLibraryLogs(log *slog.Logger) { slog.SetDefault(log) }
