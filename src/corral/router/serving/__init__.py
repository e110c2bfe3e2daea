"""The router's lean HTTP/1.1 server side (`corral router --http-server lean`)."""
