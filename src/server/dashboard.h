// The live dashboard (issue 24): GET / and /dashboard/* serve the embedded page (static, no data
// in it); GET /v1/stats serves the JSON it polls, behind --api-key like the API (the page sends
// the key it is given in its URL fragment, #key=KEY, which browsers never send to the server).
#pragma once

#include "engine/engine.h"
#include "server/server.h"

namespace httplib {
class Server;
}

namespace fb::server {

// Registers the routes; `eng` and `opt` must outlive `svr`.
void add_dashboard(httplib::Server& svr, const engine::Engine& eng, const ServerOptions& opt);

}  // namespace fb::server
