// Finding whether the client of a request has gone away. cpp-httplib 0.11 (Debian) gives a
// handler no socket and no "connection closed" query, so the connection's socket is found by
// its peer address (getpeername over our own descriptors, once per request) and polled for
// EOF / hang-up while the request waits on the engine. The descriptor stays open until the
// handler returns (httplib closes it afterwards), so it cannot be reused under us.
#pragma once

#include <string>

namespace fb::server {

class PeerSocket {
 public:
  // Looks up the connected socket whose peer is remote_addr:remote_port (-1: not found).
  PeerSocket(const std::string& remote_addr, int remote_port);
  bool found() const { return fd_ >= 0; }
  // True once the client closed or reset the connection (never when not found).
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace fb::server
