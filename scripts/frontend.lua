-- wrk script for scripts/bench-issue15.sh frontend: POSTs one JSON body,
-- read from the file KVFAST_BODY names, to the URL wrk is given.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local path = os.getenv("KVFAST_BODY")
if path == nil then
  error("set KVFAST_BODY to the file holding the request body")
end
local f = assert(io.open(path, "rb"))
wrk.body = f:read("*a")
f:close()
