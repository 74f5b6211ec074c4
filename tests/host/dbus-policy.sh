#!/bin/bash
# D-Bus policy check against a real, private dbus-daemon configured like the
# system bus (Debian's own system.conf, with its listen address, user switch
# and include dirs replaced), with systemd/io.openshift.OSStream1.conf in its
# system.d. A stub service (python3-gi) owns the name as root; gdbus clients
# then call it as root and as nobody.
set -euo pipefail
# shellcheck source=tests/host/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NAME=io.openshift.OSStream1
OBJ=/io/openshift/OSStream1
IFACE=io.openshift.OSStream1
POLICY="$REPO_ROOT/systemd/io.openshift.OSStream1.conf"
PY=/usr/bin/python3 # Debian's python: python3-gi lives there

need_cmd dbus-daemon dbus-daemon
need_file /usr/share/dbus-1/system.conf dbus-daemon dbus-system-bus-common
need_cmd gdbus libglib2.0-bin
need_cmd setpriv util-linux
need_file "$PY" python3
"$PY" -c 'import gi; gi.require_version("Gio", "2.0")' 2>/dev/null || apt_install python3-gi gir1.2-glib-2.0

t="$(new_tmpdir)"
rm_on_exit "$t"
chmod 0755 "$t" # nobody must reach the socket
mkdir -p "$t/system.d"
install -m 0644 "$POLICY" "$t/system.d/"

# The bus config: the distribution's system bus policy verbatim, minus what
# only makes sense for the real instance (pid file, fork, user switch,
# activation helper, the host's include dirs).
"$PY" - /usr/share/dbus-1/system.conf "$t" >"$t/bus.conf" <<'EOF'
import sys, xml.etree.ElementTree as ET
src, t = sys.argv[1], sys.argv[2]
root = ET.parse(src).getroot()
drop = {"user", "fork", "pidfile", "syslog", "servicehelper",
        "standard_system_servicedirs", "listen", "include", "includedir"}
for el in [e for e in root if e.tag in drop]:
    root.remove(el)
assert root.find("type").text == "system"
assert root.find("auth").text == "EXTERNAL"
ET.SubElement(root, "listen").text = f"unix:path={t}/bus.sock"
ET.SubElement(root, "includedir").text = f"{t}/system.d"
sys.stdout.write('<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus '
                 'Configuration 1.0//EN" "http://www.freedesktop.org/standards/'
                 'dbus/1.0/busconfig.dtd">\n')
sys.stdout.write(ET.tostring(root, encoding="unicode"))
EOF

dbus-daemon --config-file="$t/bus.conf" --nofork --nopidfile \
    --print-address=3 3>"$t/address" 2>"$t/daemon.log" &
kill_on_exit $!
for _ in $(seq 50); do [[ -s "$t/address" ]] && break; sleep 0.1; done
[[ -s "$t/address" ]] || die "dbus-daemon did not start: $(cat "$t/daemon.log")"
export DBUS_SYSTEM_BUS_ADDRESS="unix:path=$t/bus.sock"

# Stub streamd: the interface shape only matters to the policy.
cat >"$t/stub.py" <<'EOF'
import sys
from gi.repository import Gio, GLib
XML = """<node><interface name="io.openshift.OSStream1">
  <property name="State" type="s" access="read"/>
  <property name="Stream" type="s" access="read"/>
  <method name="Reconcile"/>
  <method name="Preflight"><arg name="opts" type="a{ss}" direction="in"/></method>
  <method name="Plan"><arg name="opts" type="a{ss}" direction="in"/></method>
</interface></node>"""
info = Gio.DBusNodeInfo.new_for_xml(XML).interfaces[0]
def call(conn, sender, path, iface, method, params, inv):
    inv.return_value(None)
def get(conn, sender, path, iface, prop):
    return GLib.Variant("s", {"State": "Idle", "Stream": "stub"}[prop])
bus = Gio.bus_get_sync(Gio.BusType.SYSTEM, None)
bus.register_object("/io/openshift/OSStream1", info, call, get, None)
loop = GLib.MainLoop()
def acquired(*_):
    print("owned", flush=True)
def lost(*_):
    print("name lost/denied", file=sys.stderr, flush=True)
    loop.quit()
    sys.exit(1)
Gio.bus_own_name_on_connection(bus, "io.openshift.OSStream1",
                               Gio.BusNameOwnerFlags.NONE, acquired, lost)
loop.run()
EOF
"$PY" "$t/stub.py" >"$t/stub.out" 2>"$t/stub.err" &
kill_on_exit $!
for _ in $(seq 50); do grep -q owned "$t/stub.out" 2>/dev/null && break; sleep 0.1; done
grep -q owned "$t/stub.out" || die "root could not own $NAME: $(cat "$t/stub.err" "$t/daemon.log")"
log "root owns $NAME"

as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; }
gcall=(gdbus call --system --dest "$NAME" --object-path "$OBJ" --method)

pass=0 fail=0
# expect allow|deny DESCRIPTION COMMAND...
expect() {
    local want="$1" what="$2" out rc=0
    shift 2
    out="$("$@" 2>&1)" || rc=$?
    if [[ $want == allow && $rc -eq 0 ]] ||
        [[ $want == deny && $rc -ne 0 && $out == *org.freedesktop.DBus.Error.AccessDenied* ]]; then
        pass=$((pass + 1))
        log "ok   $what: $want"
    else
        fail=$((fail + 1))
        log "FAIL $what: wanted $want, got rc=$rc: $out"
    fi
}

expect allow "root Reconcile()" "${gcall[@]}" "$IFACE.Reconcile"
expect allow "root Preflight(a{ss})" "${gcall[@]}" "$IFACE.Preflight" "{'dry-run': 'true'}"
expect allow "root Plan(a{ss})" "${gcall[@]}" "$IFACE.Plan" "{}"
expect allow "nobody Properties.Get" as_nobody "${gcall[@]}" org.freedesktop.DBus.Properties.Get "$IFACE" State
expect allow "nobody Properties.GetAll" as_nobody "${gcall[@]}" org.freedesktop.DBus.Properties.GetAll "$IFACE"
expect allow "nobody Introspect" as_nobody "${gcall[@]}" org.freedesktop.DBus.Introspectable.Introspect
expect allow "nobody Peer.Ping" as_nobody "${gcall[@]}" org.freedesktop.DBus.Peer.Ping
expect deny "nobody Reconcile()" as_nobody "${gcall[@]}" "$IFACE.Reconcile"
expect deny "nobody Preflight(a{ss})" as_nobody "${gcall[@]}" "$IFACE.Preflight" "{}"
expect deny "nobody Plan(a{ss})" as_nobody "${gcall[@]}" "$IFACE.Plan" "{}"
expect deny "nobody Properties.Set" as_nobody "${gcall[@]}" org.freedesktop.DBus.Properties.Set "$IFACE" State "<'Done'>"
expect deny "nobody RequestName($NAME)" as_nobody gdbus call --system \
    --dest org.freedesktop.DBus --object-path /org/freedesktop/DBus \
    --method org.freedesktop.DBus.RequestName "$NAME" 0

# dbus-daemon skips a broken file in an includedir with only a log line:
# any complaint about the config (ours or the transformed system.conf) fails.
if grep -E 'OSStream1\.conf|bus\.conf|Encountered error|[Pp]arse' "$t/daemon.log" >&2; then
    fail=$((fail + 1))
    log "FAIL dbus-daemon reported problems with the configuration"
fi

[[ $fail -eq 0 ]] || die "$fail of $((pass + fail)) policy expectations failed"
result "dbus-policy: $pass/$pass expectations met (root: all methods; nobody: Get/GetAll/Introspect/Ping only)"
