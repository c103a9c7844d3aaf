//! `cubec link`, `unlink`, `edges`, `walk`, `path` and `del --detach`:
//! arguments, output formats and exit codes of the edge commands.

use std::io::Write;

use clap::{ArgGroup, Args};
use cube_client::{
    Client, Coord, Direction, EdgeInfo, EdgeLabel, EdgeWeight, NamespaceName, WalkOptions,
    WalkStop, base64, json, parse_coord,
};
use serde_json::{Value, json};

use super::{
    EXIT_NOT_FOUND, Failure, coord_json, emit, emit_line, escape_value, parse_namespace_arg,
};

pub(crate) const LINK_HELP: &str = "\
Re-linking the same FROM, TO and --label sets the weight. Weights are finite
numbers >= 0 (default 1); labels are up to 64 bytes (default empty).

Examples:
  cubec link default 0,0,0 1,0,0
  cubec link default 0,0,0 0,1,0 --label road --weight 2.5
  cubec --json link default 1,0,0 1,1,0 --label pipe";

pub(crate) const UNLINK_HELP: &str = "\
Removes the edge FROM -> TO with --label (default: the empty label).
Exits 1 when there was no such edge.

Examples:
  cubec unlink default 0,0,0 1,0,0
  cubec unlink default 0,0,0 0,1,0 --label road";

pub(crate) const EDGES_HELP: &str = "\
One line per edge: `out<TAB>X,Y,Z<TAB>LABEL<TAB>WEIGHT` for FROM -> X,Y,Z and
`in<TAB>...` for X,Y,Z -> FROM, outgoing first; labels escaped like scan
values. With --json, one object with an \"edges\" array. A coordinate without
edges prints nothing and exits 0.

Examples:
  cubec edges default 0,0,0
  cubec edges default 0,0,0 --out --label road
  cubec --json edges default 1,0,0 --in";

pub(crate) const WALK_HELP: &str = "\
Breadth-first from START: one line per coordinate reached, nearest first,
`X,Y,Z<TAB>DISTANCE` (hops), each coordinate once; START itself is not
listed, so a coordinate without edges prints nothing. --values adds a
third field with the cell's value (escaped like scan values); a cell without
a value has no third field. A walk that stops early at a limit says so on
stderr (and in the JSON \"stop\" field): the nodes listed are then the nearest.
--depth and --max-nodes default to (and may not exceed) the daemon's
--max-walk-depth and --max-walk-nodes.

Examples:
  cubec walk default 0,0,0 --depth 3
  cubec walk default 0,0,0 --depth 2 --both --label road --values
  cubec --json walk default 0,0,0 --max-nodes 100";

pub(crate) const PATH_HELP: &str = "\
The cheapest path FROM -> ... -> TO along outgoing edges, by total weight
(Dijkstra), printed as `X,Y,Z -> X,Y,Z -> ...` then `(cost C, N hops)`.
Exits 1 when there is no path (within --max-cost).

Examples:
  cubec path default 0,0,0 9,9,9
  cubec path default 0,0,0 9,9,9 --label road --max-cost 40
  cubec --json path default 0,0,0 2,0,0";

fn parse_label(text: &str) -> Result<EdgeLabel, String> {
    EdgeLabel::new(text)
}

fn parse_weight(text: &str) -> Result<f64, String> {
    let weight: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("weight {text:?} is not a number"))?;
    EdgeWeight::new(weight).map(EdgeWeight::get)
}

fn parse_max_cost(text: &str) -> Result<f64, String> {
    let cost: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("max cost {text:?} is not a number (inf for no bound)"))?;
    if cost.is_nan() || cost < 0.0 {
        return Err(format!("max cost {text} must be >= 0"));
    }
    Ok(cost)
}

#[derive(Debug, Args)]
pub(crate) struct EdgeArgs {
    /// Namespace: 1 to 64 of a-z, 0-9, '_' and '-' (a fresh server has `default`)
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    pub(crate) ns: NamespaceName,

    /// Where the edge starts, as X,Y,Z
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "FROM")]
    pub(crate) from: Coord,

    /// Where the edge ends, as X,Y,Z (the same namespace)
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "TO")]
    pub(crate) to: Coord,

    /// The edge's label, up to 64 bytes
    #[arg(long, value_parser = parse_label, default_value = "", value_name = "LABEL")]
    pub(crate) label: EdgeLabel,
}

#[derive(Debug, Args)]
pub(crate) struct LinkArgs {
    #[command(flatten)]
    pub(crate) edge: EdgeArgs,

    /// The edge's weight: a finite number >= 0
    #[arg(long, value_parser = parse_weight, default_value = "1", allow_hyphen_values = true,
          value_name = "W")]
    pub(crate) weight: f64,
}

/// `--in`, `--out`, `--both`: at most one.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("direction").args(["incoming", "outgoing", "both"])))]
pub(crate) struct DirectionArgs {
    /// Edges arriving at the coordinate
    #[arg(long = "in")]
    incoming: bool,

    /// Edges leaving the coordinate
    #[arg(long = "out")]
    outgoing: bool,

    /// Edges in both directions
    #[arg(long)]
    both: bool,
}

impl DirectionArgs {
    fn direction(&self, default: Direction) -> Direction {
        match (self.incoming, self.outgoing, self.both) {
            (true, _, _) => Direction::In,
            (_, true, _) => Direction::Out,
            (_, _, true) => Direction::Both,
            _ => default,
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct EdgesArgs {
    /// Namespace: 1 to 64 of a-z, 0-9, '_' and '-'
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    ns: NamespaceName,

    /// The coordinate whose edges to list, as X,Y,Z
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "X,Y,Z")]
    coord: Coord,

    /// Only edges with this label
    #[arg(long, value_parser = parse_label, value_name = "LABEL")]
    label: Option<EdgeLabel>,

    /// Which edges (default: both directions)
    #[command(flatten)]
    direction: DirectionArgs,
}

#[derive(Debug, Args)]
pub(crate) struct WalkArgs {
    /// Namespace: 1 to 64 of a-z, 0-9, '_' and '-'
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    ns: NamespaceName,

    /// Where the walk starts, as X,Y,Z
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "START")]
    start: Coord,

    /// Most hops (default: the daemon's --max-walk-depth)
    #[arg(long, value_name = "D", value_parser = clap::value_parser!(u32).range(1..))]
    depth: Option<u32>,

    /// Most coordinates listed (default: the daemon's --max-walk-nodes)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_nodes: Option<u32>,

    /// Follow only edges with this label
    #[arg(long, value_parser = parse_label, value_name = "LABEL")]
    label: Option<EdgeLabel>,

    /// Also print each reached cell's value
    #[arg(long)]
    values: bool,

    /// Which edges to follow (default: --out)
    #[command(flatten)]
    direction: DirectionArgs,
}

#[derive(Debug, Args)]
pub(crate) struct PathArgs {
    /// Namespace: 1 to 64 of a-z, 0-9, '_' and '-'
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    ns: NamespaceName,

    /// Where the path starts, as X,Y,Z
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "FROM")]
    from: Coord,

    /// Where it ends, as X,Y,Z
    #[arg(value_parser = parse_coord, allow_hyphen_values = true, value_name = "TO")]
    to: Coord,

    /// Follow only edges with this label
    #[arg(long, value_parser = parse_label, value_name = "LABEL")]
    label: Option<EdgeLabel>,

    /// Ignore paths costing more than this (default: no bound)
    #[arg(long, value_parser = parse_max_cost, allow_hyphen_values = true, value_name = "C")]
    max_cost: Option<f64>,
}

fn label_text(label: &EdgeLabel) -> String {
    let mut out = Vec::new();
    escape_value(label.as_str().as_bytes(), &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// `{"ns":..,"from":..,"to":..,"label":..}` followed by `more` (an
/// object's fields).
fn edge_json(args: &EdgeArgs, more: Value) -> String {
    let mut object = json!({
        "ns": args.ns.as_str(),
        "from": coord_json(args.from),
        "to": coord_json(args.to),
        "label": args.label.as_str(),
    });
    if let (Some(fields), Value::Object(more)) = (object.as_object_mut(), more) {
        fields.extend(more);
    }
    json::to_string(&object)
}

fn describe_edge(args: &EdgeArgs) -> String {
    if args.label.is_empty() {
        format!("{} {} -> {}", args.ns, args.from, args.to)
    } else {
        format!(
            "{} {} -> {} (label {})",
            args.ns,
            args.from,
            args.to,
            label_text(&args.label)
        )
    }
}

pub(crate) fn link(
    client: &mut Client,
    args: &LinkArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let e = &args.edge;
    let linked = client.link(e.ns.as_str(), e.from, e.to, e.label.as_str(), args.weight)?;
    let line = if as_json {
        edge_json(
            e,
            json!({"weight": args.weight, "created": linked.created, "lsn": linked.lsn}),
        )
    } else {
        format!(
            "{} {}, weight {} (lsn {})",
            if linked.created { "linked" } else { "updated" },
            describe_edge(e),
            args.weight,
            linked.lsn
        )
    };
    emit_line(out, &line)?;
    Ok(0)
}

pub(crate) fn unlink(
    client: &mut Client,
    args: &EdgeArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let existed = client.unlink(args.ns.as_str(), args.from, args.to, args.label.as_str())?;
    if as_json {
        emit_line(out, &edge_json(args, json!({"existed": existed})))?;
    } else if existed {
        emit_line(out, &format!("unlinked {}", describe_edge(args)))?;
    } else {
        eprintln!("cubec: no edge {}; nothing unlinked", describe_edge(args));
    }
    Ok(if existed { 0 } else { EXIT_NOT_FOUND })
}

fn edge_info_json(edge: &EdgeInfo) -> Value {
    json!({
        "direction": edge.direction.name(),
        "other": coord_json(edge.other),
        "label": edge.label.as_str(),
        "weight": edge.weight,
    })
}

pub(crate) fn edges(
    client: &mut Client,
    args: &EdgesArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let direction = args.direction.direction(Direction::Both);
    let label = args.label.as_ref().map(EdgeLabel::as_str);
    let edges = client.edges(args.ns.as_str(), args.coord, direction, label)?;
    if as_json {
        let items: Vec<Value> = edges.iter().map(edge_info_json).collect();
        emit_line(
            out,
            &json::to_string(&json!({
                "ns": args.ns.as_str(),
                "coord": coord_json(args.coord),
                "edges": items,
            })),
        )?;
        return Ok(0);
    }
    for edge in &edges {
        emit_line(
            out,
            &format!(
                "{}\t{}\t{}\t{}",
                edge.direction.name(),
                edge.other,
                label_text(&edge.label),
                edge.weight
            ),
        )?;
    }
    Ok(0)
}

fn stop_explanation(stop: WalkStop) -> &'static str {
    match stop {
        WalkStop::Complete => "complete",
        WalkStop::MaxNodes => {
            "it reached the node limit (--max-nodes, or the daemon's --max-walk-nodes)"
        }
        WalkStop::MaxWork => {
            "it examined as many edges as the daemon allows one walk (cubed --max-walk-work); \
             narrow it with --depth or --label"
        }
        WalkStop::FrameFull => {
            "the values filled one answer; walk without --values, or with --max-nodes"
        }
    }
}

pub(crate) fn walk(
    client: &mut Client,
    args: &WalkArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let options = WalkOptions {
        direction: args.direction.direction(Direction::Out),
        label: args.label.as_ref().map(|l| l.as_str().to_owned()),
        max_depth: args.depth.unwrap_or(0),
        max_nodes: args.max_nodes.unwrap_or(0),
        with_values: args.values,
    };
    let walk = client.walk(args.ns.as_str(), args.start, &options)?;
    if as_json {
        let nodes: Vec<Value> = walk
            .nodes
            .iter()
            .map(|node| {
                let mut item = json!({"coord": coord_json(node.coord), "distance": node.distance});
                if let (true, Some(fields)) = (args.values, item.as_object_mut()) {
                    let value = node.value.as_deref();
                    fields.insert(
                        "value".to_owned(),
                        json!(value.and_then(|v| std::str::from_utf8(v).ok())),
                    );
                    fields.insert("value_base64".to_owned(), json!(value.map(base64::encode)));
                }
                item
            })
            .collect();
        let text = json::to_string(&json!({
            "ns": args.ns.as_str(),
            "start": coord_json(args.start),
            "stop": walk.stop.name(),
            "edges_examined": walk.edges_examined,
            "nodes": nodes,
        }));
        emit_line(out, &text)?;
    } else {
        let mut line = Vec::with_capacity(256);
        for node in &walk.nodes {
            line.clear();
            line.extend_from_slice(format!("{}\t{}", node.coord, node.distance).as_bytes());
            if let Some(value) = &node.value {
                line.push(b'\t');
                escape_value(value, &mut line);
            }
            line.push(b'\n');
            emit(out, &line)?;
        }
    }
    if walk.stop != WalkStop::Complete {
        eprintln!(
            "cubec: the walk stopped early after {} coordinates: {}",
            walk.nodes.len(),
            stop_explanation(walk.stop)
        );
    }
    Ok(0)
}

pub(crate) fn path(
    client: &mut Client,
    args: &PathArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let label = args.label.as_ref().map(EdgeLabel::as_str);
    let max_cost = args.max_cost.unwrap_or(f64::INFINITY);
    let answer = client.path(args.ns.as_str(), args.from, args.to, label, max_cost)?;
    if as_json {
        let (cost, coords) = match &answer.path {
            Some(path) => (
                json!(path.cost),
                path.coords.iter().map(|c| coord_json(*c)).collect(),
            ),
            None => (Value::Null, Value::Null),
        };
        emit_line(
            out,
            &json::to_string(&json!({
                "ns": args.ns.as_str(),
                "from": coord_json(args.from),
                "to": coord_json(args.to),
                "found": answer.path.is_some(),
                "cost": cost,
                "coords": coords,
                "edges_examined": answer.edges_examined,
            })),
        )?;
    } else if let Some(path) = &answer.path {
        let coords: Vec<String> = path.coords.iter().map(Coord::to_string).collect();
        let hops = path.coords.len().saturating_sub(1);
        emit_line(
            out,
            &format!(
                "{} (cost {}, {hops} hop{})",
                coords.join(" -> "),
                path.cost,
                if hops == 1 { "" } else { "s" }
            ),
        )?;
    }
    if answer.path.is_none() {
        if !as_json {
            let bound = args
                .max_cost
                .map_or(String::new(), |c| format!(" costing at most {c}"));
            eprintln!(
                "cubec: no path from {} to {} in {}{bound}",
                args.from, args.to, args.ns
            );
        }
        return Ok(EXIT_NOT_FOUND);
    }
    Ok(0)
}

/// `del NS X,Y,Z --detach`: the value and every incident edge, atomically.
pub(crate) fn detach(
    client: &mut Client,
    ns: &NamespaceName,
    coord: Coord,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let detached = client.detach(ns.as_str(), coord)?;
    let anything = detached.existed || detached.edges_removed > 0;
    if as_json {
        emit_line(
            out,
            &json::to_string(&json!({
                "ns": ns.as_str(),
                "coord": coord_json(coord),
                "existed": detached.existed,
                "edges_removed": detached.edges_removed,
            })),
        )?;
    } else if anything {
        emit_line(
            out,
            &format!(
                "deleted {ns} {coord}{} and {} edge{}",
                if detached.existed { "" } else { " (no value)" },
                detached.edges_removed,
                if detached.edges_removed == 1 { "" } else { "s" }
            ),
        )?;
    } else {
        eprintln!("cubec: no value and no edges at {ns} {coord}; nothing deleted");
    }
    Ok(if anything { 0 } else { EXIT_NOT_FOUND })
}
