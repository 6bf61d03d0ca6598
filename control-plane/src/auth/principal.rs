//! Who is calling: a [`Principal`] and its [`Role`].

/// What a principal is allowed to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An end user; its name is its user id.
    User,
    /// A service (agent platform). With `act_for_users` it may name the user it acts for
    /// (`x-berth-act-as`, or `user_id` on CreateSession); without, it is a user of its own.
    Service { act_for_users: bool },
    /// An operator: AdminService, and every workspace.
    Admin,
    /// `--auth none`: the local operator of a loopback-only deployment; may do anything
    /// and act for anyone.
    Local,
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// User id, service name or admin name (`sub` of a JWT).
    pub name: String,
    pub role: Role,
    /// The user this call is made for (`x-berth-act-as`); only principals that may act for
    /// users carry one.
    pub acting_for: Option<String>,
    /// Unsandboxed backends (`local`) an operator granted this principal: a token's
    /// `backends = ["local"]` or a JWT's `berth_backends` claim. Sandboxed backends need no
    /// grant; admins need none for any backend.
    pub granted_backends: Vec<String>,
}

impl Principal {
    pub fn new(name: impl Into<String>, role: Role) -> Self {
        Self { name: name.into(), role, acting_for: None, granted_backends: Vec::new() }
    }

    /// The trusted local operator of `--auth none`.
    pub fn local() -> Self {
        Self::new("local", Role::Local)
    }

    pub fn may_act_for_users(&self) -> bool {
        matches!(self.role, Role::Service { act_for_users: true } | Role::Admin | Role::Local)
    }

    pub fn is_admin(&self) -> bool {
        matches!(self.role, Role::Admin | Role::Local)
    }

    /// May this principal have a workspace on `backend`? Sandboxed backends are open to
    /// everyone; an unsandboxed one (`berth_proto::backends`) to admins (and `--auth none`'s
    /// local operator) and to principals it was granted to.
    pub fn may_use_backend(&self, backend: &str) -> bool {
        !berth_proto::backends::is_unsandboxed(backend)
            || self.is_admin()
            || self.granted_backends.iter().any(|granted| granted == backend)
    }

    /// May this principal land on a node's default backend whatever it is? Only when it
    /// may use every unsandboxed backend.
    pub fn may_use_any_backend(&self) -> bool {
        berth_proto::backends::UNSANDBOXED_BACKENDS.iter().all(|backend| self.may_use_backend(backend))
    }

    /// The user id the call is made as: the acted-for user, else the principal's own name.
    pub fn user(&self) -> &str {
        self.acting_for.as_deref().unwrap_or(&self.name)
    }

    /// `role:name[ as user]`, for audit lines and messages.
    pub fn label(&self) -> String {
        let role = match self.role {
            Role::User => "user",
            Role::Service { .. } => "service",
            Role::Admin => "admin",
            Role::Local => "local",
        };
        match &self.acting_for {
            Some(user) => format!("{role}:{} as {user}", self.name),
            None => format!("{role}:{}", self.name),
        }
    }
}
