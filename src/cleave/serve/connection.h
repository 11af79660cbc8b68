// Whether a request's client is still there, for a handler that has no socket: cpp-httplib 0.11
// (Debian 12's) hands a non-streamed handler the request's addresses but neither its socket nor a
// way to learn that the client closed it. A client that gives up on a non-streamed completion
// (a timeout, Ctrl-C) should stop costing the engine steps, as a streamed one does.
#pragma once
#include <string>

namespace cleave::serve {

// The socket of the connection between remote_addr:remote_port and this process's local_port,
// among this process's descriptors (/proc/self/fd); -1 where none matches. The connection stays
// open, and its descriptor its own, while the handler of a request on it runs.
int find_connection(const std::string& remote_addr, int remote_port, int local_port);

// Whether the peer has closed or reset the connection (poll's POLLRDHUP, POLLHUP or POLLERR):
// nothing is read, so a request it pipelined behind this one is left for the server. A client
// that only shuts its sending side while it waits for the answer reads as gone too; HTTP/1.1
// clients do not (vLLM's check of a client's disconnect is the same).
bool connection_closed(int fd);

}  // namespace cleave::serve
