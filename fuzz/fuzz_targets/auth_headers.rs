//! Authentication of arbitrary request headers (bearer tokens, JWTs, act-as) and arbitrary
//! tokens files: never panics; a principal that comes out has a valid name, and a user
//! token never acts for someone else.
#![no_main]

use std::sync::OnceLock;

use berth_control_plane::auth::jwt::{ClaimCheck, JwtConfig, JwtKey};
use berth_control_plane::auth::tokens::TokenStore;
use berth_control_plane::auth::{AuthConfig, Authenticator, Role};
use libfuzzer_sys::fuzz_target;

struct Fixture {
    tokens: Authenticator,
    jwt: Authenticator,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(
            &tokens,
            "[[token]]\nsecret = \"alice-token-0123456789\"\nuser = \"alice\"\n\
             [[token]]\nsecret = \"platform-token-0123456789\"\nservice = \"platform\"\nact_for_users = true\n",
        )
        .unwrap();
        let secret = dir.path().join("jwt.secret");
        std::fs::write(&secret, "jwt-secret-0123456789abcdef").unwrap();
        let tokens = Authenticator::from_config(&AuthConfig::Tokens { file: tokens }).expect("tokens");
        let mut jwt = JwtConfig::new(JwtKey::Secret(secret));
        jwt.issuer = ClaimCheck::Waived;
        jwt.audience = ClaimCheck::Waived;
        let jwt = Authenticator::from_config(&AuthConfig::Jwt(jwt)).expect("jwt");
        Fixture { tokens, jwt, _dir: dir }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    if selector % 4 == 0 {
        // A tokens file: parsed or refused, never a panic.
        let _ = TokenStore::from_text(&text);
        return;
    }
    let (authorization, act_as) = text.split_once('\n').unwrap_or((&text, ""));
    let mut headers = http::HeaderMap::new();
    if let Ok(value) = http::HeaderValue::from_str(authorization) {
        headers.insert("authorization", value);
    }
    if selector % 2 == 1 && !act_as.is_empty() {
        if let Ok(value) = http::HeaderValue::from_str(act_as) {
            headers.insert("x-berth-act-as", value);
        }
    }
    let fixture = fixture();
    let authenticator = if selector % 4 == 1 { &fixture.tokens } else { &fixture.jwt };
    if let Ok(principal) = authenticator.authenticate(&headers) {
        berth_workspace::validate_id("principal", &principal.name).expect("principal names are valid ids");
        if principal.role == Role::User {
            assert!(principal.acting_for.is_none(), "a user acts for someone");
        }
    }
});
