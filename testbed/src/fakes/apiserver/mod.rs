//! Fake Kubernetes API server (HTTPS, client certificates and bearer tokens).
//!
//! Serves Nodes, core/v1 and events.k8s.io/v1 Events, Namespaces, Pods (graceful deletion, the eviction
//! subresource), PodDisruptionBudgets, Leases, OSImageStreams, CustomResourceDefinitions and
//! what they define, and RBAC roles from an in-memory store with real resourceVersion, watch,
//! patch and conflict semantics, plus the discovery documents the real `kubectl` needs, and
//! authorizes like a cluster's Node and RBAC authorizers. See `docs/testbed.md` for the contract.

mod auth;
mod authz;
mod availability;
pub(crate) mod clock;
mod crd;
mod discovery;
mod faults;
mod fields;
mod patch;
mod pki;
mod pods;
mod routes;
pub mod schema;
mod selector;
mod stats;
mod status;
mod store;
mod table;
mod validate;
mod watch;

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use crate::control::{ApiServerCmd, Fault};

use availability::Availability;
use discovery::{CUSTOMRESOURCEDEFINITIONS, NODES, Served};
use faults::Faults;
use stats::Stats;
use store::{Scope, Store};

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and for which node an [`ApiServer`] runs.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// Directory that receives `pki/`, `kubeconfig` and `kubeconfig-admin`.
    pub dir: PathBuf,
    /// Name of the Node object the server starts with (the node identity's `system:node:<name>`).
    pub node_name: String,
}

/// One entry of an OSImageStream's `status.availableStreams`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamImages {
    /// Stream name, e.g. `rhel-10`.
    pub name: String,
    /// Digest-pinned OS image.
    pub os_image: String,
    /// Digest-pinned extensions image.
    pub extensions_image: String,
}

/// State shared by the accept loop, the connections and the control interface.
pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) stats: Stats,
    pub(crate) faults: Faults,
    pub(crate) admin_token: String,
    /// `127.0.0.1:<port>`, for `/api`'s `serverAddressByClientCIDRs`.
    pub(crate) server_addr: String,
    /// The OSImageStream version served (`v1` unless changed).
    pub(crate) served: tokio::sync::watch::Sender<Served>,
    /// Whether the port is open; the accept loop publishes it so `refuse` can wait for it.
    listening: tokio::sync::watch::Sender<bool>,
    /// Verifies client certificate chains against the current client CA (per request, as
    /// kube-apiserver's x509 authenticator does); replaced by `rotate-client-ca`.
    client_verifier: std::sync::RwLock<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    /// Rotations of the client CA so far.
    client_generation: std::sync::atomic::AtomicU64,
    pki_dir: PathBuf,
    node_name: String,
    /// The testbed CA (PEM) and its signer, for the client certificates of added nodes.
    ca_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// Bearer tokens of users added with [`ApiServer::add_user`]: token → user name.
    tokens: std::sync::RwLock<std::collections::HashMap<String, String>>,
    /// How long a gracefully deleted pod's kubelet takes to stop it (at most the grace period).
    pod_removal_delay_ms: std::sync::atomic::AtomicU64,
    /// Nodes unavailable (cordoned or not Ready) over time.
    pub(crate) availability: Availability,
    /// Field ownership for server-side apply.
    pub(crate) fields: fields::ManagedFields,
}

impl Shared {
    /// The user a bearer token other than the admin's authenticates.
    pub(crate) fn token_user(&self, token: &str) -> Option<String> {
        self.tokens.read().ok()?.get(token).cloned()
    }

    /// See [`Shared::pod_removal_delay_ms`].
    pub(crate) fn pod_removal_delay(&self) -> Duration {
        Duration::from_millis(
            self.pod_removal_delay_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Serves exactly the versions of the stored CustomResourceDefinitions (and marks new ones
    /// Established, as the API server's own controllers do).
    pub(crate) fn sync_crds(&self) {
        let (crds, _) = self.store.list(&CUSTOMRESOURCEDEFINITIONS, None, |_| true);
        let mut defs = Vec::new();
        for crd in &crds {
            defs.extend(crd::served_defs(crd));
            let established = crd
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Established"));
            if let (false, Some(name)) = (
                established,
                crd.pointer("/metadata/name").and_then(Value::as_str),
            ) {
                let result = self.store.update(
                    &CUSTOMRESOURCEDEFINITIONS,
                    None,
                    name,
                    Scope::Status,
                    |cur| {
                        let mut next = cur.clone();
                        next["status"] = crd::established_status(cur);
                        Ok(next)
                    },
                );
                if let Err(err) = result {
                    tracing::warn!(
                        crd = name,
                        error = err.message,
                        "apiserver crd not established"
                    );
                }
            }
        }
        self.served
            .send_modify(|served| *served = served.with_custom(defs));
    }
    /// The user a client certificate chain authenticates, if it verifies against the current
    /// client CA; a chain that does not is no identity (so 401 unless a token is also sent).
    fn cert_user(
        &self,
        chain: Option<&[rustls::pki_types::CertificateDer<'static>]>,
    ) -> Option<Arc<str>> {
        let (end_entity, intermediates) = chain?.split_first()?;
        let verifier = self.client_verifier.read().ok()?.clone();
        match verifier.verify_client_cert(
            end_entity,
            intermediates,
            rustls::pki_types::UnixTime::now(),
        ) {
            Ok(_) => auth::cert_user(chain).map(Arc::from),
            Err(err) => {
                tracing::debug!(%err, "apiserver client certificate does not verify");
                None
            }
        }
    }
}

/// A running fake API server. Dropping it stops accepting and closes every connection.
pub struct ApiServer {
    url: String,
    dir: PathBuf,
    node_name: String,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer").finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Generates the PKI under `dir/pki` (CA, server certificate for `127.0.0.1` and
    /// `localhost`, client certificate `CN=system:node:<node>, O=system:nodes`, admin
    /// token in `dir/pki/admin-token`), binds `https://127.0.0.1:<random port>`, writes
    /// `dir/kubeconfig` (node client certificate) and `dir/kubeconfig-admin` (bearer
    /// token, user `admin`) and creates the initial Node and namespaces.
    pub async fn start(cfg: ApiServerConfig) -> anyhow::Result<ApiServer> {
        let pki = pki::generate(&cfg.dir.join("pki"), &cfg.node_name)?;
        let tls = TlsAcceptor::from(Arc::new(pki::server_config(&pki)?));
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .context("binding the API server port")?;
        let addr = listener.local_addr()?;
        let url = format!("https://{addr}");
        pki::write_kubeconfigs(&cfg.dir, &url, &pki, &cfg.node_name)?;

        let mut uid_seed = [0u8; 16];
        pki::random_bytes(&mut uid_seed)?;
        let store = Store::new(uid_seed);
        store
            .seed(&cfg.node_name)
            .map_err(|err| anyhow!("creating the initial objects: {}", err.message))?;
        let shared = Arc::new(Shared {
            store,
            stats: Stats::default(),
            faults: Faults::new(),
            admin_token: pki.admin_token.clone(),
            server_addr: addr.to_string(),
            served: tokio::sync::watch::Sender::new(Served::default()),
            listening: tokio::sync::watch::Sender::new(true),
            client_verifier: std::sync::RwLock::new(pki::client_verifier(pki.ca_der.clone())?),
            client_generation: std::sync::atomic::AtomicU64::new(0),
            pki_dir: cfg.dir.join("pki"),
            node_name: cfg.node_name.clone(),
            ca_pem: pki.ca_pem.clone(),
            issuer: pki.issuer,
            tokens: Default::default(),
            pod_removal_delay_ms: Default::default(),
            availability: Availability::default(),
            fields: Default::default(),
        });
        availability::spawn(shared.clone());
        let accept = tokio::spawn(accept_loop(listener, tls, shared.clone()));
        tracing::info!(url, node = cfg.node_name, "apiserver listening");
        Ok(ApiServer {
            url,
            dir: cfg.dir,
            node_name: cfg.node_name,
            shared,
            accept,
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs one control command (see `docs/testbed.md`): `stats` → `{"total":N,"by_user":…}`,
    /// `fault` → the resulting fault state (`refuse` and `clear` return once the port is closed
    /// or open again; `gone` compacts the history too), `serve-osimagestreams` switches the
    /// served OSImageStream version (discovery, paths and `apiVersion` follow; open watches on a
    /// version no longer served end; the stored object is kept), `get-node` → the Node,
    /// `node-annotations` → its annotations.
    pub async fn control(&self, cmd: ApiServerCmd) -> anyhow::Result<Value> {
        Ok(match cmd {
            ApiServerCmd::Stats { since_ms, until_ms } => {
                self.shared.stats.snapshot(since_ms, until_ms)
            }
            ApiServerCmd::Requests => self.shared.stats.requests(),
            ApiServerCmd::InjectedFaults => self.shared.faults.injected(),
            ApiServerCmd::ResetStats => {
                self.shared.stats.reset();
                json!({})
            }
            ApiServerCmd::Unavailable => self.shared.availability.snapshot(),
            ApiServerCmd::ResetUnavailable => {
                self.shared.availability.reset(&self.shared.store);
                self.shared.availability.snapshot()
            }
            ApiServerCmd::PodRemoval { delay_ms } => {
                self.shared
                    .pod_removal_delay_ms
                    .store(delay_ms, std::sync::atomic::Ordering::Relaxed);
                json!({ "delay_ms": delay_ms })
            }
            ApiServerCmd::AddUser { user } => json!({ "kubeconfig": self.add_user(&user)? }),
            ApiServerCmd::Fault(fault) => self.fault(&fault).await?,
            ApiServerCmd::ServeOsimagestreams { version } => {
                self.serve_os_image_streams(version.as_deref())?;
                json!({})
            }
            ApiServerCmd::RotateClientCa => self.rotate_client_ca()?,
            ApiServerCmd::GetNode => (*self.node()?).clone(),
            ApiServerCmd::NodeAnnotations => self
                .node()?
                .pointer("/metadata/annotations")
                .cloned()
                .unwrap_or_else(|| json!({})),
        })
    }

    /// Applies `fault` and returns the fault state.
    async fn fault(&self, fault: &Fault) -> anyhow::Result<Value> {
        let state = self.shared.faults.apply(fault)?;
        match fault {
            // Resuming from any resourceVersion seen so far must now also get 410.
            Fault::Gone { .. } => self.shared.store.compact(),
            // Return only once the port is actually closed or open again.
            Fault::Refuse { .. } | Fault::Clear => {
                let open = state["refuse"] == false;
                let mut listening = self.shared.listening.subscribe();
                tokio::time::timeout(Duration::from_secs(10), listening.wait_for(|l| *l == open))
                    .await
                    .context("the API server port did not change state")??;
            }
            _ => {}
        }
        Ok(state)
    }

    /// A new client CA: the kubelet's next client certificate is signed by it and only its
    /// certificates authenticate from now on.
    fn rotate_client_ca(&self) -> anyhow::Result<Value> {
        let shared = &self.shared;
        let generation = shared
            .client_generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        let verifier = pki::rotate_client_ca(&shared.pki_dir, &shared.node_name, generation)?;
        *shared
            .client_verifier
            .write()
            .map_err(|_| anyhow!("client verifier lock poisoned"))? = verifier;
        Ok(json!({ "generation": generation }))
    }

    /// Serves the OSImageStream CRD as `version` (`"v1"`, `"v1alpha1"`) or not at all (`None`);
    /// see the `serve-osimagestreams` control command.
    pub fn serve_os_image_streams(&self, version: Option<&str>) -> anyhow::Result<()> {
        let served = Served::new(version).map_err(|e| anyhow!(e))?;
        self.shared
            .served
            .send_modify(|current| *current = current.with_osimagestreams_of(&served));
        Ok(())
    }

    /// Creates the OSImageStream `cluster` with `spec.defaultStream` and then, through the
    /// status subresource as the machine-config operator does, its `status` (the default
    /// stream and `streams`). Validation is the CRD's, so a malformed entry is an error.
    pub fn create_os_image_stream(
        &self,
        default_stream: &str,
        streams: &[StreamImages],
    ) -> anyhow::Result<()> {
        self.create_os_image_stream_by(None, default_stream, streams)
    }

    /// The same, written by the machine-config operator build `written_by` (its
    /// `machineconfiguration.openshift.io/release-image-version` annotation), when given.
    pub fn create_os_image_stream_by(
        &self,
        written_by: Option<&str>,
        default_stream: &str,
        streams: &[StreamImages],
    ) -> anyhow::Result<()> {
        let store = &self.shared.store;
        let api = |err: status::ApiError| anyhow!("OSImageStream cluster: {}", err.message);
        let def = self
            .shared
            .served
            .borrow()
            .osimagestreams()
            .ok_or_else(|| anyhow!("OSImageStreams are not served"))?;
        store
            .create(
                def,
                None,
                json!({
                    "metadata": match written_by {
                        Some(v) => json!({
                            "name": "cluster",
                            "annotations": {
                                "machineconfiguration.openshift.io/release-image-version": v,
                            },
                        }),
                        None => json!({ "name": "cluster" }),
                    },
                    "spec": { "defaultStream": default_stream },
                }),
            )
            .map_err(api)?;
        let available: Vec<Value> = streams
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "osImage": s.os_image,
                    "osExtensionsImage": s.extensions_image,
                })
            })
            .collect();
        store
            .update(def, None, "cluster", Scope::Status, |_| {
                Ok(json!({ "status": {
                    "defaultStream": default_stream,
                    "availableStreams": available,
                }}))
            })
            .map_err(api)?;
        Ok(())
    }

    /// Creates every object of a (multi-document) YAML manifest as the admin would with
    /// `kubectl create -f`: each `apiVersion`/`kind` must be a served type; namespaced objects go
    /// to their `metadata.namespace` (`default` if unset).
    pub fn create_manifests(&self, yaml: &str) -> anyhow::Result<()> {
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(yaml).context("parsing the YAML manifest")?;
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            self.create(doc)?;
        }
        Ok(())
    }

    /// The served definition of `api_version`/`kind`.
    fn def_of(
        &self,
        api_version: &str,
        kind: &str,
    ) -> anyhow::Result<&'static discovery::ResourceDef> {
        discovery::find_kind(&self.shared.served.borrow(), api_version, kind)
            .ok_or_else(|| anyhow!("{api_version} {kind} is not a served type"))
    }

    /// Creates one object as a `POST` by the admin would (its `apiVersion` and `kind` name the
    /// type; a namespaced one goes to `metadata.namespace`, `default` if unset) and returns it
    /// as stored.
    pub fn create(&self, obj: Value) -> anyhow::Result<Value> {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_string();
        let kind = obj["kind"].as_str().unwrap_or_default().to_string();
        let def = self.def_of(&api_version, &kind)?;
        let ns = def.namespaced.then(|| {
            obj.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default")
                .to_string()
        });
        routes::create_object(&self.shared, def, ns.as_deref(), obj)
            .map(|o| (*o).clone())
            .map_err(|err| anyhow!("creating {kind}: {}", err.message))
    }

    /// The object `api_version`/`kind` `name` (in `namespace` if namespaced).
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> anyhow::Result<Value> {
        let def = self.def_of(api_version, kind)?;
        self.shared
            .store
            .get(def, namespace, name)
            .map(|o| (*o).clone())
            .map_err(|err| anyhow!(err.message))
    }

    /// Every object of `api_version`/`kind` (in `namespace`, or all).
    pub fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> anyhow::Result<Vec<Value>> {
        let def = self.def_of(api_version, kind)?;
        let (items, _) = self.shared.store.list(def, namespace, |_| true);
        Ok(items.iter().map(|o| (**o).clone()).collect())
    }

    /// Rewrites an object (not its status, for types with a status subresource) as a client's
    /// `PUT` would, without a request: `edit` changes a copy of the stored object.
    pub fn update(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        edit: impl FnOnce(&mut Value),
    ) -> anyhow::Result<Value> {
        self.update_scope(api_version, kind, namespace, name, Scope::Main, edit)
            .map_err(|m| anyhow!("updating {kind} {name}: {m}"))
    }

    /// Deletes the pod `namespace/name` as a client's `DELETE` with `gracePeriodSeconds:
    /// grace` would, without a request: a pod bound to a node is only marked and goes once its
    /// kubelet removes it (the `pod-removal` delay, at most `grace`).
    pub fn delete_pod(&self, namespace: &str, name: &str, grace: i64) -> anyhow::Result<()> {
        let opts = pods::DeleteOptions::from_value(&json!({ "gracePeriodSeconds": grace }))
            .map_err(|err| anyhow!("deleting pod {namespace}/{name}: {}", err.message))?;
        pods::delete(&self.shared, &discovery::PODS, Some(namespace), name, &opts)
            .map_err(|err| anyhow!("deleting pod {namespace}/{name}: {}", err.message))?;
        self.shared
            .fields
            .forget(&discovery::PODS, Some(namespace), name);
        routes::after_write(&self.shared, &discovery::PODS, Some(namespace));
        Ok(())
    }

    /// Rewrites the status of an object as its controller or kubelet would through the `status`
    /// subresource (`edit` changes a copy of the stored object; only its `status` is kept).
    pub fn update_status(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        edit: impl FnOnce(&mut Value),
    ) -> anyhow::Result<Value> {
        self.update_scope(api_version, kind, namespace, name, Scope::Status, edit)
            .map_err(|m| anyhow!("updating the status of {kind} {name}: {m}"))
    }

    /// `update` and `update_status`: one stored write of `scope`, then what follows every write.
    fn update_scope(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        scope: Scope,
        edit: impl FnOnce(&mut Value),
    ) -> Result<Value, String> {
        let def = self.def_of(api_version, kind).map_err(|e| e.to_string())?;
        let updated = self
            .shared
            .store
            .update(def, namespace, name, scope, |cur| {
                let mut next = cur.clone();
                edit(&mut next);
                Ok(next)
            })
            .map_err(|err| err.message)?;
        routes::after_write(&self.shared, def, namespace);
        Ok((*updated).clone())
    }

    /// Adds a node to the cluster: its Node object as a freshly registered worker's kubelet
    /// creates it (unless it exists) and, in `dir`, a client certificate for
    /// `system:node:<name>` signed by the testbed CA (`dir/pki/kubelet-client-current.pem`) and
    /// the kubeconfig that uses it (`dir/kubeconfig`, returned).
    pub fn add_node(&self, name: &str, dir: &std::path::Path) -> anyhow::Result<PathBuf> {
        if self.shared.store.get(&NODES, None, name).is_err() {
            self.shared
                .store
                .create_node(name)
                .map_err(|err| anyhow!("creating node {name}: {}", err.message))?;
        }
        pki::write_other_node(
            dir,
            &self.url,
            &self.shared.ca_pem,
            &self.shared.issuer,
            name,
        )?;
        Ok(dir.join("kubeconfig"))
    }

    /// Adds a user authenticated by a new bearer token (a service account's
    /// `system:serviceaccount:<ns>:<name>`, or any name) and writes a kubeconfig for it,
    /// `DIR/kubeconfig-<user with ':' as '-'>`; returns its path. The user gets only what
    /// RBAC bindings grant it.
    pub fn add_user(&self, user: &str) -> anyhow::Result<PathBuf> {
        if user.is_empty() || user == "admin" || user.starts_with("system:node:") {
            bail!("add-user: {user:?} is not a name a token may authenticate");
        }
        let mut token = [0u8; 24];
        pki::random_bytes(&mut token)?;
        let token: String = token.iter().map(|b| format!("{b:02x}")).collect();
        let file = format!(
            "kubeconfig-{}",
            user.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "-")
        );
        let path = self.dir.join(file);
        pki::write_token_kubeconfig(&path, &self.url, &self.dir.join("pki/ca.crt"), user, &token)?;
        self.shared
            .tokens
            .write()
            .map_err(|_| anyhow!("token table lock poisoned"))?
            .insert(token, user.to_string());
        Ok(path)
    }

    fn node(&self) -> anyhow::Result<Arc<Value>> {
        self.shared
            .store
            .get(&NODES, None, &self.node_name)
            .map_err(|err| anyhow!(err.message))
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        // The accept task owns the connection tasks; aborting it aborts them all.
        self.accept.abort();
    }
}

/// Accepts connections; while the `refuse` fault is on the port is closed, so clients
/// get "connection refused" as from an apiserver that is down.
async fn accept_loop(listener: TcpListener, tls: TlsAcceptor, shared: Arc<Shared>) {
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(err) => {
            tracing::error!(%err, "apiserver listener has no address");
            return;
        }
    };
    let mut listener = Some(listener);
    let mut refusals = shared.faults.refusals();
    let mut connections = JoinSet::new();
    loop {
        if *refusals.borrow_and_update() {
            listener = None;
        } else if listener.is_none() {
            // Tokio sets SO_REUSEADDR, so the old connections' TIME_WAIT does not block this.
            match TcpListener::bind(addr).await {
                Ok(reopened) => listener = Some(reopened),
                Err(err) => {
                    tracing::warn!(%err, %addr, "apiserver cannot reopen its port, retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
        }
        shared.listening.send_replace(listener.is_some());
        tokio::select! {
            changed = refusals.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            accepted = accept(listener.as_ref()) => match accepted {
                Ok((tcp, _)) => {
                    connections.spawn(serve_connection(tcp, tls.clone(), shared.clone()));
                }
                Err(err) => {
                    // Typically EMFILE; back off instead of spinning.
                    tracing::warn!(%err, "apiserver accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next() => {}
        }
    }
}

async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

async fn serve_connection(tcp: TcpStream, tls: TlsAcceptor, shared: Arc<Shared>) {
    let mut refusals = shared.faults.refusals();
    // Watch events are small writes that must not wait for Nagle.
    if let Err(err) = tcp.set_nodelay(true) {
        tracing::debug!(%err, "apiserver could not set TCP_NODELAY");
    }
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => {
            tracing::debug!(%err, "apiserver tls handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!("apiserver tls handshake timed out");
            return;
        }
    };
    let chain: Option<Arc<[rustls::pki_types::CertificateDer<'static>]>> = stream
        .get_ref()
        .1
        .peer_certificates()
        .map(|c| c.iter().map(|d| d.clone().into_owned()).collect());
    let service = service_fn(move |req| {
        let shared = shared.clone();
        let cert_user = shared.cert_user(chain.as_deref());
        async move { Ok::<_, Infallible>(routes::handle(shared, req, cert_user).await) }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        result = connection => {
            if let Err(err) = result {
                tracing::debug!(%err, "apiserver connection ended with an error");
            }
        }
        _ = refusals.wait_for(|on| *on) => {
            tracing::debug!("apiserver connection cut (refuse fault)");
        }
    }
}
