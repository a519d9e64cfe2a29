# nginx.sh — sourced by the tests that serve a loopback Hugging Face mirror (e2e_setup.sh, e2e_server_stream.sh):
# find_nginx TEST sets NGINX to the nginx binary, installing Debian's nginx-light when it is missing and this runs as
# root; without one it prints "TEST: SKIP: ..." and calls the test's finish (0 failed).
find_nginx() {
    NGINX=$(command -v nginx || echo /usr/sbin/nginx)
    if [ ! -x "$NGINX" ] && [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null 2>&1
        NGINX=$(command -v nginx || echo /usr/sbin/nginx)
    fi
    if [ ! -x "$NGINX" ]; then echo "$1: SKIP: nginx is not installed and cannot be (apt-get install nginx-light)"; finish; fi
}
