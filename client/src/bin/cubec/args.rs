//! Arguments several commands share.

use clap::Args;
use cube_client::{Coord, NamespaceName, parse_coord};

pub(crate) fn parse_namespace_arg(text: &str) -> Result<NamespaceName, String> {
    NamespaceName::new(text).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub(crate) struct CellArgs {
    /// Namespace: 1 to 64 of a-z, 0-9, '_' and '-' (a fresh server has `default`)
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    pub(crate) ns: NamespaceName,

    /// Cell coordinate as X,Y,Z: three 32-bit signed integers, e.g. -1,2,3
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "X,Y,Z")]
    pub(crate) coord: Coord,
}

/// A namespace and a box in it (`cubec scan`, `cubec watch`).
#[derive(Debug, Args)]
pub(crate) struct BoxArgs {
    /// Namespace: 1 to 64 of a-z, 0-9, '_' and '-' (a fresh server has `default`)
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    pub(crate) ns: NamespaceName,

    /// The box's low corner, e.g. -10,-10,0
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "X0,Y0,Z0")]
    pub(crate) lo: Coord,

    /// The box's high corner, e.g. 10,10,0
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "X1,Y1,Z1")]
    pub(crate) hi: Coord,
}
