#include "cleave/serve/connection.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace cleave::serve {

namespace {

// The address and port of a socket's end, written as cpp-httplib writes a request's
// (getnameinfo with NI_NUMERICHOST: an IPv6 link-local address keeps its %scope).
bool end_of(const sockaddr_storage& a, socklen_t length, std::string& host, int& port) {
  char text[NI_MAXHOST] = {};
  if (a.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  else if (a.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  else return false;
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), length, text, sizeof text, nullptr, 0,
                  NI_NUMERICHOST) != 0)
    return false;
  host = text;
  return true;
}

}  // namespace

int find_connection(const std::string& remote_addr, int remote_port, int local_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
      continue;  // not a socket, or one with no peer (the listening socket)
    std::string local_host, peer_host;
    int local_p = -1, peer_p = -1;
    if (!end_of(local, local_len, local_host, local_p) || !end_of(peer, peer_len, peer_host, peer_p))
      continue;
    if (local_p == local_port && peer_p == remote_port && peer_host == remote_addr) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool connection_closed(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace cleave::serve
