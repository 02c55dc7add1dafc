#include "server/peer_socket.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace fb::server {

PeerSocket::PeerSocket(const std::string& remote_addr, int remote_port) {
  if (remote_addr.empty() || remote_port <= 0) return;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    struct stat st;
    if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&ss), &len) != 0) continue;
    char host[NI_MAXHOST], port[NI_MAXSERV];
    // The same formatting httplib uses for Request::remote_addr / remote_port.
    if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
      continue;
    if (remote_addr == host && std::atoi(port) == remote_port) {
      fd_ = int(fd);
      break;
    }
  }
  closedir(d);
}

bool PeerSocket::closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, short(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return true;
  if (p.revents & POLLIN) {
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;  // EOF; > 0 is a pipelined next request, < 0 EAGAIN
  }
  return false;
}

}  // namespace fb::server
